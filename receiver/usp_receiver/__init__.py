"""Verify and deduplicate USP webhooks.

The whole user-facing surface is here::

    from usp_receiver import JWKS, RemoteJWKS, Verifier, VerificationPolicy, sign_request

See the README's quick start. Errors are one hierarchy rooted at :class:`ReceiverError`, each
with a stable ``reason`` code.
"""

from ._digest import check_content_digest, content_digest
from ._errors import (
    BadSignature,
    DigestMismatch,
    DuplicateEvent,
    ExpiredSignature,
    FutureSignature,
    InvalidEvent,
    KeyFetchError,
    MalformedSignature,
    MissingComponent,
    MissingSignature,
    ReceiverError,
    StaleSignature,
    TagMismatch,
    UnknownKey,
    VerificationError,
)
from ._keys import DEFAULT_ALGORITHMS, KeyResolver, PublicKey, SigningKey, jwk_thumbprint
from ._sign import SignedMember, sign_message, sign_request
from ._verify import PROFILE_COMPONENTS, USP_TAG, VerificationPolicy, Verified, Verifier

__all__ = [
    "DEFAULT_ALGORITHMS",
    "PROFILE_COMPONENTS",
    "USP_TAG",
    "BadSignature",
    "DigestMismatch",
    "DuplicateEvent",
    "ExpiredSignature",
    "FutureSignature",
    "InvalidEvent",
    "KeyFetchError",
    "KeyResolver",
    "MalformedSignature",
    "MissingComponent",
    "MissingSignature",
    "PublicKey",
    "ReceiverError",
    "SignedMember",
    "SigningKey",
    "StaleSignature",
    "TagMismatch",
    "UnknownKey",
    "VerificationError",
    "VerificationPolicy",
    "Verified",
    "Verifier",
    "check_content_digest",
    "content_digest",
    "jwk_thumbprint",
    "sign_message",
    "sign_request",
]
