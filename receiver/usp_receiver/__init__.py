"""Verify and deduplicate USP webhooks.

The whole user-facing surface is here::

    from usp_receiver import JWKS, RemoteJWKS, Verifier, VerificationPolicy, WebhookReceiver, sign_request

and, for events a business publishes to its own broker, ``verify_message`` (:mod:`usp_receiver.messages`).

Framework integrations are imported explicitly, so the base install needs none of them:
``usp_receiver.asgi`` (any ASGI server), ``usp_receiver.fastapi``, ``usp_receiver.mcp``, and the
``usp-receiver`` command (``usp_receiver.cli``).

See the README's quick start. Errors are one hierarchy rooted at :class:`ReceiverError`, each
with a stable ``reason`` code.
"""

from usp_receiver._digest import check_content_digest, content_digest
from usp_receiver._errors import (
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
from usp_receiver._jwks import JWKS, KeyRing, RemoteJWKS, cache_lifetime
from usp_receiver._jws import (
    JWS_TYP,
    VerifiedNotification,
    averify_notification_params,
    canonical_notification_payload,
    sign_notification_params,
    verify_notification_params,
)
from usp_receiver._keys import DEFAULT_ALGORITHMS, KeyResolver, PublicKey, SigningKey, jwk_thumbprint
from usp_receiver._receive import Outcome, ReceivedWebhook, WebhookReceiver, problem_outcome
from usp_receiver._sign import SignedMember, sign_message, sign_request
from usp_receiver._verify import PROFILE_COMPONENTS, USP_TAG, VerificationPolicy, Verified, Verifier
from usp_receiver.messages import MESSAGE_COMPONENTS, destination, sign_message_headers, verify_message

__all__ = [
    "DEFAULT_ALGORITHMS",
    "JWKS",
    "JWS_TYP",
    "MESSAGE_COMPONENTS",
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
    "KeyRing",
    "MalformedSignature",
    "MissingComponent",
    "MissingSignature",
    "Outcome",
    "PublicKey",
    "ReceivedWebhook",
    "ReceiverError",
    "RemoteJWKS",
    "SignedMember",
    "SigningKey",
    "StaleSignature",
    "TagMismatch",
    "UnknownKey",
    "VerificationError",
    "VerificationPolicy",
    "Verified",
    "VerifiedNotification",
    "Verifier",
    "WebhookReceiver",
    "averify_notification_params",
    "cache_lifetime",
    "canonical_notification_payload",
    "check_content_digest",
    "content_digest",
    "destination",
    "jwk_thumbprint",
    "problem_outcome",
    "sign_message",
    "sign_message_headers",
    "sign_notification_params",
    "sign_request",
    "verify_message",
    "verify_notification_params",
]
