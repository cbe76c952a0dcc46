"""How a delivery proves itself to a gateway in front of the endpoint, beside the signature:
OAuth 2.0 client credentials (RFC 6749 §4.4: a token fetched, cached until it expires, fetched
again once on a 401) or mutual TLS (a client certificate and key of the subscription's). The
secrets (the client secret, the private key) are sealed at rest and never shown or logged.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlencode

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pydantic import SecretStr

from usp_core.settings import CommonSettings
from usp_core.ssrf import TargetRefused, check_target, send_pinned
from usp_workers.engine.webhook_secrets import seal_bytes, unseal_bytes

__all__ = [
    "MASK",
    "MTLS",
    "OAUTH2",
    "TOKENS",
    "AuthError",
    "EndpointAuth",
    "MutualTLS",
    "OAuth2ClientCredentials",
    "TokenCache",
    "TokenFailed",
    "check_auth",
    "load",
    "masked",
    "mtls_client",
    "mtls_context",
    "store",
]

OAUTH2: Final = "oauth2_client_credentials"
MTLS: Final = "mtls"
MASK: Final = "********"
#: A token is used until this many seconds before it expires (a try in flight must not outlive it).
EXPIRY_MARGIN: Final = 30.0
_MAX_TOKEN_BYTES: Final = 16_384
_MAX_PEM: Final = 16_384


class AuthError(ValueError):
    """Endpoint authentication that cannot be saved; ``where`` names the member at fault."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"auth.{where}: {problem}")
        self.where = f"auth.{where}"
        self.problem = problem


class TokenFailed(Exception):
    """No token could be had from the token endpoint: an attempt outcome, with its reason."""


@dataclass(frozen=True, slots=True)
class OAuth2ClientCredentials:
    token_url: str
    client_id: str
    client_secret: str
    scope: str | None = None
    audience: str | None = None

    @property
    def cache_key(self) -> str:
        """Who the token is for: a changed secret or scope is another token."""
        material = json.dumps([self.token_url, self.client_id, self.client_secret, self.scope, self.audience])
        return hashlib.sha256(material.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class MutualTLS:
    certificate: str  #: PEM, the chain the client presents
    private_key: str  #: PEM
    ca_certificate: str | None = (
        None  #: PEM: trust the endpoint's certificate from this CA (else the system's)
    )

    @property
    def cache_key(self) -> str:
        material = self.certificate + self.private_key + (self.ca_certificate or "")
        return hashlib.sha256(material.encode()).hexdigest()


EndpointAuth = OAuth2ClientCredentials | MutualTLS


def check_auth(asked: Mapping[str, Any]) -> EndpointAuth:
    """``{"type": ..., ...}`` checked; :class:`AuthError` names the member at fault. (The token
    URL's address is checked by the caller, as a webhook URL is.)"""
    kind = asked.get("type")
    if kind == OAUTH2:
        token_url = _text(asked, "token_url", 2048)
        if not token_url.startswith(("https://", "http://")):
            raise AuthError("token_url", "must be an http(s) URL")
        return OAuth2ClientCredentials(
            token_url,
            _text(asked, "client_id", 256),
            _text(asked, "client_secret", 1024),
            _text(asked, "scope", 1024, required=False) or None,
            _text(asked, "audience", 1024, required=False) or None,
        )
    if kind == MTLS:
        certificate = _text(asked, "certificate", _MAX_PEM)
        private_key = _text(asked, "private_key", _MAX_PEM)
        ca = _text(asked, "ca_certificate", _MAX_PEM, required=False) or None
        try:
            leaf = x509.load_pem_x509_certificates(certificate.encode())[0]
        except ValueError:
            raise AuthError("certificate", "is not a PEM certificate") from None
        try:
            key = serialization.load_pem_private_key(private_key.encode(), password=None)
        except (ValueError, TypeError):
            raise AuthError("private_key", "is not an unencrypted PEM private key") from None
        if _public_der(key.public_key()) != _public_der(leaf.public_key()):
            raise AuthError("private_key", "is not the key of the certificate")
        if ca is not None:
            try:
                x509.load_pem_x509_certificates(ca.encode())
            except ValueError:
                raise AuthError("ca_certificate", "is not a PEM certificate") from None
        return MutualTLS(certificate, private_key, ca)
    raise AuthError("type", f"must be {OAUTH2} or {MTLS}")


def _public_der(key: Any) -> bytes:
    return bytes(
        key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def _text(asked: Mapping[str, Any], name: str, limit: int, *, required: bool = True) -> str:
    value = asked.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise AuthError(name, f"must be text of 1 to {limit} characters")
    return value.strip()


def store(auth: EndpointAuth, key: SecretStr | None, subscription_id: str) -> str:
    """The stored form: JSON, the client secret or private key sealed for the subscription's row
    (:class:`~usp_workers.engine.webhook_secrets.SecretsUnavailable` without ``USP_SECRETS_KEY``)."""
    if isinstance(auth, OAuth2ClientCredentials):
        document: dict[str, Any] = {
            "type": OAUTH2,
            "token_url": auth.token_url,
            "client_id": auth.client_id,
            "scope": auth.scope,
            "audience": auth.audience,
            "client_secret": seal_bytes(auth.client_secret.encode(), key, subscription_id),
        }
    else:
        document = {
            "type": MTLS,
            "certificate": auth.certificate,
            "ca_certificate": auth.ca_certificate,
            "private_key": seal_bytes(auth.private_key.encode(), key, subscription_id),
        }
    return json.dumps(document, separators=(",", ":"))


def load(stored: str, key: SecretStr | None, subscription_id: str) -> EndpointAuth:
    """What a try uses, the secret unsealed."""
    document = json.loads(stored)
    if document["type"] == OAUTH2:
        return OAuth2ClientCredentials(
            document["token_url"],
            document["client_id"],
            unseal_bytes(document["client_secret"], key, subscription_id).decode(),
            document.get("scope"),
            document.get("audience"),
        )
    return MutualTLS(
        document["certificate"],
        unseal_bytes(document["private_key"], key, subscription_id).decode(),
        document.get("ca_certificate"),
    )


def masked(stored: str | None) -> dict[str, Any] | None:
    """What every view shows: the public members, :data:`MASK` for the secret one, and for a
    client certificate its subject and expiry."""
    if not stored:
        return None
    document = json.loads(stored)
    if document["type"] == OAUTH2:
        return {
            "type": OAUTH2,
            "token_url": document["token_url"],
            "client_id": document["client_id"],
            "scope": document.get("scope"),
            "audience": document.get("audience"),
            "client_secret": MASK,
        }
    leaf = x509.load_pem_x509_certificates(document["certificate"].encode())[0]
    return {
        "type": MTLS,
        "certificate_subject": leaf.subject.rfc4514_string(),
        "certificate_not_after": leaf.not_valid_after_utc.isoformat(),
        "ca_certificate": document.get("ca_certificate") is not None,
        "private_key": MASK,
    }


def mtls_context(auth: MutualTLS) -> ssl.SSLContext:
    """The TLS context that presents the subscription's certificate (and trusts its CA, if any)."""
    if auth.ca_certificate:
        context = ssl.create_default_context(cadata=auth.ca_certificate)
    else:
        context = ssl.create_default_context()
    # ssl loads a certificate chain from files only: written for the moment, 0600, then removed.
    with tempfile.TemporaryDirectory() as folder:
        cert, private = os.path.join(folder, "cert.pem"), os.path.join(folder, "key.pem")
        for path, text in ((cert, auth.certificate), (private, auth.private_key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
                handle.write(text)
        context.load_cert_chain(cert, private)
    return context


class TokenCache:
    """OAuth tokens of this process, by who they are for, until :data:`EXPIRY_MARGIN` before they
    expire; concurrent tries that need the same token share one fetch."""

    def __init__(self) -> None:
        self._tokens: dict[str, tuple[str, float]] = {}
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}  #: per event loop: a lock is bound to one

    def forget(self, auth: OAuth2ClientCredentials) -> None:
        """Drop the cached token (the endpoint answered 401: it may have been revoked)."""
        self._tokens.pop(auth.cache_key, None)

    async def token(
        self, auth: OAuth2ClientCredentials, client: httpx.AsyncClient, settings: CommonSettings
    ) -> str:
        """A valid token: the cached one, else one fetched now. :class:`TokenFailed` says why not."""
        key = auth.cache_key
        cached = self._tokens.get(key)
        if cached is not None and time.monotonic() < cached[1]:
            return cached[0]
        lock = self._locks.setdefault((id(asyncio.get_running_loop()), key), asyncio.Lock())
        async with lock:
            cached = self._tokens.get(key)
            if cached is not None and time.monotonic() < cached[1]:
                return cached[0]
            token, lifetime = await fetch_token(auth, client, settings)
            self._tokens[key] = (token, time.monotonic() + max(0.0, lifetime - EXPIRY_MARGIN))
            return token


#: The tokens of this process's deliveries.
TOKENS: Final = TokenCache()
_MTLS_CLIENTS: dict[tuple[int, str], httpx.AsyncClient] = {}
_MAX_MTLS_CLIENTS: Final = 64


def mtls_client(auth: MutualTLS, settings: CommonSettings) -> httpx.AsyncClient:
    """The client that presents ``auth``'s certificate, one per certificate and event loop,
    kept for the next tries (at most :data:`_MAX_MTLS_CLIENTS`; the oldest is closed)."""
    key = (id(asyncio.get_running_loop()), auth.cache_key)
    client = _MTLS_CLIENTS.get(key)
    if client is None:
        if len(_MTLS_CLIENTS) >= _MAX_MTLS_CLIENTS:
            oldest = next(iter(_MTLS_CLIENTS))
            asyncio.get_running_loop().create_task(_MTLS_CLIENTS.pop(oldest).aclose())
        client = httpx.AsyncClient(
            verify=mtls_context(auth),
            trust_env=False,
            follow_redirects=False,
            timeout=httpx.Timeout(settings.total_timeout, connect=settings.connect_timeout),
        )
        _MTLS_CLIENTS[key] = client
    return client


async def fetch_token(
    auth: OAuth2ClientCredentials, client: httpx.AsyncClient, settings: CommonSettings
) -> tuple[str, float]:
    """One client-credentials request (client_secret_basic, RFC 6749 §2.3.1) to the checked
    address of the token URL: the token and its lifetime in seconds."""
    try:
        target = await check_target(auth.token_url, settings)
    except TargetRefused as exc:
        raise TokenFailed(f"the token URL is refused: {exc}") from None
    form = {"grant_type": "client_credentials"}
    if auth.scope:
        form["scope"] = auth.scope
    if auth.audience:
        form["audience"] = auth.audience
    basic = base64.b64encode(f"{_form(auth.client_id)}:{_form(auth.client_secret)}".encode()).decode("ascii")
    headers = {
        "Content-Type": "application/x-www-form-urlencoded",
        "Accept": "application/json",
        "Authorization": f"Basic {basic}",
    }
    try:
        response = await send_pinned(
            client,
            target,
            content=urlencode(form).encode(),
            headers=headers,
            timeout=httpx.Timeout(settings.total_timeout, connect=settings.connect_timeout),
            total_timeout=settings.total_timeout,
            max_response_bytes=_MAX_TOKEN_BYTES,
        )
    except httpx.HTTPError as exc:
        raise TokenFailed(f"the token endpoint did not answer ({type(exc).__name__})") from None
    if response.status_code != 200:
        raise TokenFailed(f"the token endpoint answered {response.status_code}")
    try:
        document = json.loads(response.content)
        token = document["access_token"]
        kind = str(document.get("token_type", "Bearer"))
        lifetime = float(document.get("expires_in", 3600))
    except (ValueError, KeyError, TypeError):
        raise TokenFailed("the token endpoint's answer is not a token (RFC 6749 §5.1)") from None
    if not isinstance(token, str) or not token or kind.lower() != "bearer":
        raise TokenFailed(f"the token endpoint gave no bearer token (token_type {kind[:20]!r})")
    return token, lifetime


def _form(value: str) -> str:
    """RFC 6749 §2.3.1: the client id and secret are form-encoded before Basic encoding."""
    return urlencode({"": value})[1:]
