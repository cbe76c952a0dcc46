"""RFC 9530 ``Content-Digest``: always computed over the exact bytes sent, always checked.

``http_message_signatures`` checks a digest only when handed the body; forgetting to pass it lets
a valid signature vouch for any body. Here the check is not optional. The common case (one
``sha-256`` member, as our signer writes it) is a string comparison; every other form
(``sha-512``, several members, odd spacing) goes through the library's RFC 9530 parser.
"""

from __future__ import annotations

import base64
import hashlib

from http_message_signatures import ContentDigest, HTTPMessageSignaturesException

from usp_receiver._errors import DigestMismatch

__all__ = ["check_content_digest", "content_digest"]


def content_digest(body: bytes) -> str:
    """The ``Content-Digest`` field value for ``body``.

    >>> content_digest(b'{"hello": "world"}')
    'sha-256=:X48E9qOokqqrvdts8nOJRJN3OWDUoyWxBf7kbu9DBPE=:'
    """
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode("ascii") + ":"


def check_content_digest(field_value: str | None, body: bytes) -> None:
    """Raise :class:`DigestMismatch` unless ``field_value`` is a valid digest of ``body``.

    Every member must match (RFC 9530 leaves the choice to the recipient; accepting a message
    where one algorithm disagrees would let an attacker pair a good sha-512 with a forged body
    under a weaker one). Unknown algorithms are refused rather than ignored.
    """
    if field_value is None:
        raise DigestMismatch("Content-Digest is missing")
    if field_value == content_digest(body):
        return
    try:
        ContentDigest.verify(field_value, body)
    except HTTPMessageSignaturesException as exc:
        raise DigestMismatch(str(exc)) from None  # its own words: "... does not match the message body"
    except (ValueError, TypeError, UnicodeError) as exc:
        raise DigestMismatch(f"Content-Digest is malformed: {exc}") from None
