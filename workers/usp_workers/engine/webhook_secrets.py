"""A subscription's Standard Webhooks secrets: made, rotated with an overlap, sealed at rest.

Sealed with AES-256-GCM under a key derived (HKDF-SHA256) from ``USP_SECRETS_KEY``, the
subscription's id bound as associated data, so a sealed value copied to another row does not
open. Why a per-subscription secret and when to rotate it: docs/protocol.md, "Two signature
schemes".
"""

from __future__ import annotations

import base64
import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

from usp_receiver import standard_webhooks

__all__ = [
    "RFC9421",
    "SCHEMES",
    "STANDARD",
    "STANDARD_V1A",
    "SecretsUnavailable",
    "Signer",
    "WebhookSecrets",
    "seal",
    "seal_bytes",
    "unseal",
    "unseal_bytes",
]

RFC9421 = "rfc9421"
STANDARD = "standard-webhooks"
STANDARD_V1A = "standard-webhooks-v1a"
#: Every scheme a subscription may name, in the order headers are made.
SCHEMES = (RFC9421, STANDARD, STANDARD_V1A)

_SEALED_PREFIX = "v1."
_INFO = b"usp-webhooks sealed webhook secrets v1"


class SecretsUnavailable(Exception):
    """No ``USP_SECRETS_KEY`` is set, or it does not open what was sealed (it changed)."""


@dataclass(frozen=True, slots=True)
class Signer:
    """One secret (``whsec_``) or signing key (``whsk_``), and when it stops signing (``None``:
    not before a rotation)."""

    value: str
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class WebhookSecrets:
    """The secrets of one subscription: HMAC secrets for ``v1`` and Ed25519 keys for ``v1a``,
    newest first; during a rotation's overlap the old one signs too."""

    hmac: tuple[Signer, ...] = ()
    ed25519: tuple[Signer, ...] = ()

    @classmethod
    def new(cls, schemes: tuple[str, ...]) -> WebhookSecrets:
        """Fresh secrets for the Standard Webhooks ``schemes`` asked for."""
        return cls(
            hmac=(Signer(standard_webhooks.new_secret()),) if STANDARD in schemes else (),
            ed25519=(Signer(standard_webhooks.new_signing_key()),) if STANDARD_V1A in schemes else (),
        )

    def signing(self, now: datetime) -> tuple[list[str], list[str]]:
        """The secrets and keys that sign at ``now``."""
        return (
            [s.value for s in self.hmac if s.until is None or s.until > now],
            [k.value for k in self.ed25519 if k.until is None or k.until > now],
        )

    def rotated(self, now: datetime, overlap: timedelta) -> WebhookSecrets:
        """A new secret (and key) first; the current ones sign on for ``overlap``; those already
        past their end are dropped."""
        until = now + overlap

        def turn(signers: tuple[Signer, ...], make: Callable[[], str]) -> tuple[Signer, ...]:
            if not signers:
                return ()
            kept = tuple(
                replace(s, until=until if s.until is None else min(s.until, until))
                for s in signers
                if s.until is None or s.until > now
            )
            return (Signer(make()), *kept)

        return WebhookSecrets(
            turn(self.hmac, standard_webhooks.new_secret),
            turn(self.ed25519, standard_webhooks.new_signing_key),
        )

    @property
    def secret(self) -> str | None:
        """The newest ``whsec_`` secret (shown once, when made)."""
        return self.hmac[0].value if self.hmac else None

    @property
    def public_key(self) -> str | None:
        """The newest key's ``whpk_`` public key (not secret, but like the secret only shown when
        made: the row holds it sealed)."""
        return standard_webhooks.public_key_of(self.ed25519[0].value) if self.ed25519 else None

    def to_json(self) -> bytes:
        def out(signers: tuple[Signer, ...]) -> list[list[str | None]]:
            return [[s.value, s.until.isoformat() if s.until else None] for s in signers]

        return json.dumps({"hmac": out(self.hmac), "ed25519": out(self.ed25519)}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> WebhookSecrets:
        raw = json.loads(data)

        def back(rows: list[list[str | None]]) -> tuple[Signer, ...]:
            return tuple(Signer(str(v), datetime.fromisoformat(u) if u else None) for v, u in rows)

        return cls(back(raw.get("hmac", [])), back(raw.get("ed25519", [])))


def seal(secrets: WebhookSecrets, key: SecretStr | None, subscription_id: str) -> str:
    """``secrets`` encrypted for the subscription's row."""
    return seal_bytes(secrets.to_json(), key, subscription_id)


def unseal(sealed: str, key: SecretStr | None, subscription_id: str) -> WebhookSecrets:
    """What :func:`seal` sealed for this subscription; :class:`SecretsUnavailable` when the key
    is unset or not the one it was sealed with."""
    return WebhookSecrets.from_json(unseal_bytes(sealed, key, subscription_id))


def seal_bytes(data: bytes, key: SecretStr | None, subscription_id: str) -> str:
    """Any secret of a subscription's (a header's value, a client certificate's key) sealed the
    same way, bound to its row."""
    nonce = os.urandom(12)
    sealed = _aead(key).encrypt(nonce, data, subscription_id.encode())
    return _SEALED_PREFIX + base64.b64encode(nonce + sealed).decode("ascii")


def unseal_bytes(sealed: str, key: SecretStr | None, subscription_id: str) -> bytes:
    """What :func:`seal_bytes` sealed for this subscription (:class:`SecretsUnavailable` if not)."""
    raw = base64.b64decode(sealed.removeprefix(_SEALED_PREFIX))
    try:
        return _aead(key).decrypt(raw[:12], raw[12:], subscription_id.encode())
    except InvalidTag:
        raise SecretsUnavailable("USP_SECRETS_KEY does not open this subscription's secrets") from None


def _aead(key: SecretStr | None) -> AESGCM:
    if key is None:
        raise SecretsUnavailable("USP_SECRETS_KEY is not set: Standard Webhooks secrets cannot be sealed")
    return _derived(key.get_secret_value())


@functools.lru_cache(maxsize=4)
def _derived(key: str) -> AESGCM:
    material = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(key.encode())
    return AESGCM(material)
