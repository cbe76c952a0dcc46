"""Agents authenticated by their HTTP message signature (RFC 9421, Web Bot Auth / OpenBotAuth).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.access.signatures``.
"""

from __future__ import annotations

import base64
import logging
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

import anyio
import httpx

from usp_core.ssrf import Resolver, TargetRefused, check_target
from usp_dispatcher.access.errors import unauthenticated
from usp_dispatcher.access.identity import Identity
from usp_dispatcher.documents import fetch_document
from usp_dispatcher.errors import DocumentUnavailable
from usp_dispatcher.settings import ApiSettings
from usp_receiver import (
    JWKS,
    PublicKey,
    SigningKey,
    UnknownKey,
    VerificationError,
    VerificationPolicy,
    Verifier,
    cache_lifetime,
    content_digest,
    jwk_thumbprint,
    sign_message,
)

__all__ = [
    "DIRECTORY_PATH",
    "WEB_BOT_AUTH_TAG",
    "DirectoryCache",
    "NonceCheck",
    "SignatureAgent",
    "default_directories",
    "parse_signature_agent",
    "verify_agent_signature",
    "web_bot_auth_headers",
]

logger = logging.getLogger("usp_dispatcher")

DIRECTORY_PATH: Final = "/.well-known/http-message-signatures-directory"
WEB_BOT_AUTH_TAG: Final = "web-bot-auth"
FETCH_TIMEOUT_SECONDS: Final = 5.0
#: How long a nonce is remembered past ``created``: the verifier's 300 s age limit and 60 s skew.
_NONCE_WINDOW: Final = 360
MAX_DIRECTORY_BYTES: Final = 64 * 1024
_ACCEPT: Final = (
    "application/http-message-signatures-directory+json, application/jwk-set+json;q=0.9, "
    "application/json;q=0.8"
)
_MAX_DIRECTORY: Final = 240  # "agent:" + directory must fit the 256-character principal columns
#: Remembers a nonce: ``(key thumbprint, nonce, keep until epoch seconds) -> first time seen?``.
NonceCheck = Callable[[str, str, float], Awaitable[bool]]
_SF_STRING: Final = re.compile(r'"([\x20\x21\x23-\x5b\x5d-\x7e]*)"')
_SF_MEMBER: Final = re.compile(r'([a-z*][a-z0-9_\-.*]{0,63})="([\x20\x21\x23-\x5b\x5d-\x7e]*)"')


@dataclass(frozen=True, slots=True)
class SignatureAgent:
    """The agent a ``Signature-Agent`` field names.

    ``directory_url`` is where its keys are: the origin's well-known directory, or the JWKS URL
    the field names. ``component`` is the serialized component id a signature must cover for it:
    ``"signature-agent"``, or ``"signature-agent";key="<member>"`` for the dictionary form (whose
    whole field, ``"signature-agent"``, covers it too).
    """

    origin: str
    directory_url: str
    component: str

    @property
    def principal(self) -> str:
        """``agent:<origin>`` for an origin's directory, ``agent:<directory URL>`` otherwise."""
        if self.directory_url == self.origin + DIRECTORY_PATH:
            return f"agent:{self.origin}"
        return f"agent:{self.directory_url}"


def parse_signature_agent(value: str, *, allow_http: bool = False) -> SignatureAgent:
    """Read a ``Signature-Agent`` field: an sf-string, a one-member dictionary, or a bare URL.

    >>> parse_signature_agent('"https://Agent.example"').directory_url
    'https://agent.example/.well-known/http-message-signatures-directory'
    >>> parse_signature_agent('sig1="https://registry.example/jwks/bot.json"').directory_url
    'https://registry.example/jwks/bot.json'
    >>> parse_signature_agent('a1="https://agent.example:8443"').component
    '"signature-agent";key="a1"'

    ``AccessError`` (-32001) for anything else: several members, another scheme, credentials in
    the URL...
    """
    text = value.strip()
    member = _SF_MEMBER.fullmatch(text)
    string = _SF_STRING.fullmatch(text)
    if member is not None:
        url, component = member.group(2), f'"signature-agent";key="{member.group(1)}"'
    elif string is not None:
        url, component = string.group(1), '"signature-agent"'
    elif text.startswith(("https://", "http://")) and " " not in text and '"' not in text:
        url, component = text, '"signature-agent"'
    else:
        raise unauthenticated("Signature-Agent must name one https URL (a string or a one-member dictionary)")
    try:
        parsed = httpx.URL(url)
        host = parsed.raw_host.decode("ascii").lower()
    except (httpx.InvalidURL, UnicodeError):
        raise unauthenticated("Signature-Agent is not a valid URL") from None
    if parsed.scheme != "https" and not (parsed.scheme == "http" and allow_http):
        raise unauthenticated("Signature-Agent must be an https URL")
    if not host or parsed.userinfo:
        raise unauthenticated("Signature-Agent must be an https URL with a host and no credentials")
    bracketed = f"[{host}]" if ":" in host else host
    default_port = {"https": 443, "http": 80}[parsed.scheme]
    port = "" if parsed.port in (None, default_port) else f":{parsed.port}"
    origin = f"{parsed.scheme}://{bracketed}{port}"
    path = parsed.raw_path.decode("ascii")
    directory = origin + (DIRECTORY_PATH if path in ("", "/") else path)
    if len(directory) > _MAX_DIRECTORY:
        raise unauthenticated("Signature-Agent names a URL that is too long")
    return SignatureAgent(origin=origin, directory_url=directory, component=component)


async def verify_agent_signature(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    settings: ApiSettings,
    resolver: Resolver | None = None,
    directories: DirectoryCache | None = None,
    nonces: NonceCheck | None = None,
    now: float | None = None,
) -> Identity:
    """The agent identity a signed request proves; ``AccessError`` (-32001) when it proves none.

    ``url`` is the URL the agent sent the request to (what ``@authority``/``@path`` cover: behind
    a proxy, the public one). ``nonces``, when given, refuses a ``nonce`` the same key used
    before within the acceptance window (a replay).
    """
    cache = directories if directories is not None else default_directories
    lowered = {name.lower(): value for name, value in headers.items()}
    field = lowered.get("signature-agent")
    if field is None:
        raise unauthenticated("a signed request needs Signature-Agent, naming the agent's key directory")
    agent = parse_signature_agent(field, allow_http=settings.allow_private_targets)
    digested = "content-digest" in lowered
    components = settings.agent_signature_components + (("content-digest",) if digested else ())
    policy = VerificationPolicy(
        required_components=components, tag=WEB_BOT_AUTH_TAG, require_digest=digested, member_compat=True
    )
    keys = await cache.keys(agent, settings, resolver=resolver)
    try:
        try:
            verified = Verifier(keys, policy).verify(method, url, headers, body, now=now)
        except UnknownKey:
            refreshed = await cache.keys(agent, settings, resolver=resolver, refresh=True)
            if refreshed is keys:
                raise
            verified = Verifier(refreshed, policy).verify(method, url, headers, body, now=now)
    except VerificationError as exc:
        raise unauthenticated(f"the request signature does not hold ({exc.reason}: {exc})") from None
    if agent.component not in verified.components and '"signature-agent"' not in verified.components:
        raise unauthenticated("the request signature does not cover Signature-Agent")
    thumbprint = jwk_thumbprint(verified.key.jwk)
    if nonces is not None and verified.nonce is not None:
        moment = time.time() if now is None else now
        keep_until = max(verified.expires or 0, (verified.created or int(moment)) + _NONCE_WINDOW)
        if not await nonces(thumbprint, verified.nonce, float(keep_until)):
            raise unauthenticated("the request signature's nonce was used before (a replayed request)")
    return Identity(
        principal=agent.principal,
        mechanism="http_message_signatures",
        key_thumbprint=thumbprint,
        key_directory=agent.directory_url,
    )


def web_bot_auth_headers(
    method: str,
    url: str,
    body: bytes,
    key: SigningKey,
    *,
    signature_agent: str,
    content_type: str = "application/json",
    digest: bool = False,
    created: int | None = None,
    ttl: int = 300,
) -> dict[str, str]:
    """Sign a request as OpenBotAuth's signer does (for agents, our agent-side MCP server and
    tests): ``Signature-Agent: sig1="<directory or JWKS URL>"``, covering ``@method``, ``@path``,
    ``@authority`` and the whole ``signature-agent`` field (plus ``content-type`` with a body, and
    ``content-digest`` when ``digest``), with ``created``, ``expires``, a fresh 64-byte ``nonce``,
    ``keyid`` (the key's thumbprint), ``alg`` and ``tag="web-bot-auth"``. Covering the whole field
    gives the one signature base OpenBotAuth's verifier and RFC 9421's agree on.

    >>> key = SigningKey.generate()
    >>> fields = web_bot_auth_headers("GET", "https://pub.example/v1/entitlements", b"", key,
    ...                               signature_agent="https://registry.example/jwks/bot.json")
    >>> fields["Signature-Agent"]
    'sig1="https://registry.example/jwks/bot.json"'
    >>> fields["Signature-Input"].startswith('sig1=("@method" "@path" "@authority" "signature-agent");')
    True
    """
    agent_field = f'sig1="{signature_agent}"'
    headers: dict[str, str] = {"Signature-Agent": agent_field}
    components = ["@method", "@path", "@authority", "signature-agent"]
    if body:
        headers["Content-Type"] = content_type
        components.append("content-type")
    if digest:
        headers["Content-Digest"] = content_digest(body)
        components.append("content-digest")
    moment = int(time.time()) if created is None else created
    member = sign_message(
        method,
        url,
        headers,
        key,
        label="sig1",
        components=components,
        created=moment,
        expires=moment + ttl,
        nonce=base64.urlsafe_b64encode(secrets.token_bytes(64)).decode().rstrip("="),
        tag=WEB_BOT_AUTH_TAG,
    )
    return headers | {"Signature-Input": member.signature_input, "Signature": member.signature}


class _DirectoryKeys:
    """A directory's keys, found by ``kid`` or by RFC 7638 thumbprint (Web Bot Auth's keyid)."""

    def __init__(self, jwks: JWKS) -> None:
        self._keys: dict[str, PublicKey] = {}
        for key in jwks:
            self._keys.setdefault(jwk_thumbprint(key.jwk), key)
            self._keys.setdefault(key.kid, key)

    def resolve(self, kid: str) -> PublicKey | None:
        return self._keys.get(kid)

    async def aresolve(self, kid: str) -> PublicKey | None:
        return self._keys.get(kid)


@dataclass(frozen=True)
class _Entry:
    """A directory as last fetched: its keys (``None`` when no fetch gave any), until when they are
    fresh and until when a failed refresh may still serve them, when it was last asked for, and
    why the last attempt failed."""

    keys: _DirectoryKeys | None
    fresh_until: float
    usable_until: float
    attempted_at: float
    failure: str | None = None


class DirectoryCache:
    """Agents' key directories, fetched SSRF-safely and cached as the receiver's ``RemoteJWKS``
    caches a JWKS (bounded, least recently used out first):

    * a copy is fresh for its answer's ``Cache-Control: max-age`` (less ``Age``), clamped to
      ``[retry_after, max_ttl]``; for ``ttl`` without one;
    * concurrent lookups of a directory that is not fresh share one fetch;
    * a ``keyid`` the copy lacks refetches it, at most once per ``retry_after``;
    * a failed refresh keeps the last keys in service, retried every ``retry_after``, for at most
      ``stale_if_error`` seconds past their freshness: an agent is not locked out while its
      directory is briefly down, and a key the directory dropped stops working that much later
      at most. Without keys, the failure is answered for ``retry_after`` without asking again.
    """

    def __init__(
        self,
        *,
        ttl: float = 300.0,
        retry_after: float = 10.0,
        max_ttl: float = 3600.0,
        stale_if_error: float = 600.0,
        max_entries: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.retry_after = retry_after
        self.max_ttl = max_ttl
        self.stale_if_error = stale_if_error
        self.max_entries = max_entries
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._fetching: dict[str, anyio.Lock] = {}
        self._clock = clock

    def clear(self) -> None:
        self._entries.clear()

    async def keys(
        self,
        agent: SignatureAgent,
        settings: ApiSettings,
        *,
        resolver: Resolver | None = None,
        refresh: bool = False,
    ) -> _DirectoryKeys:
        """The directory's keys. ``refresh``: a signature named a key the cached copy lacks,
        so fetch again unless the last fetch is younger than ``retry_after`` (then the same object
        is returned, which tells the caller nothing changed)."""
        url = agent.directory_url
        seen = self._entries.get(url)
        if seen is not None and (kept := self._kept(seen, refresh)) is not None:
            self._entries.move_to_end(url)
            return kept
        lock = self._fetching.setdefault(url, anyio.Lock())
        try:
            async with lock:
                entry = self._entries.get(url)
                if entry is not None and entry is not seen:  # fetched while this call waited
                    kept = entry.keys if entry.failure is None else self._kept(entry, False)
                    if kept is not None:
                        return kept
                return await self._fetch(url, entry, settings, resolver)
        finally:
            if not lock.statistics().tasks_waiting:
                self._fetching.pop(url, None)

    def _kept(self, entry: _Entry, refresh: bool) -> _DirectoryKeys | None:
        """The cached keys to answer with, ``None`` to fetch; raises for a failure still fresh."""
        moment = self._clock()
        if entry.keys is not None and not refresh and moment < entry.fresh_until:
            return entry.keys
        if moment - entry.attempted_at >= self.retry_after:
            return None
        if entry.keys is not None and moment < entry.usable_until:
            return entry.keys
        raise unauthenticated(entry.failure or "the agent's key directory is unavailable")

    async def _fetch(
        self, url: str, entry: _Entry | None, settings: ApiSettings, resolver: Resolver | None
    ) -> _DirectoryKeys:
        moment = self._clock()
        try:
            document = await _fetch_directory(url, settings, resolver)
        except _DirectoryUnavailable as exc:
            if entry is not None and entry.keys is not None and moment < entry.usable_until:
                logger.warning(
                    "agent key directory %s failed (%s); serving its cached keys, retrying in %.0f s",
                    url,
                    exc,
                    self.retry_after,
                )
                self._store(url, replace(entry, attempted_at=moment, failure=str(exc)))
                return entry.keys
            self._store(url, _Entry(None, moment, moment, moment, str(exc)))
            raise unauthenticated(str(exc)) from None
        keys, headers = document
        lifetime = cache_lifetime(headers, default=self.ttl, minimum=self.retry_after, maximum=self.max_ttl)
        fresh_until = moment + lifetime
        self._store(url, _Entry(keys, fresh_until, fresh_until + self.stale_if_error, moment))
        return keys

    def _store(self, url: str, entry: _Entry) -> None:
        self._entries[url] = entry
        self._entries.move_to_end(url)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


#: The process-wide cache :func:`verify_agent_signature` uses unless given another.
default_directories = DirectoryCache()


class _DirectoryUnavailable(Exception):
    """The directory could not be fetched or read; the message is safe to show."""


async def _fetch_directory(
    url: str, settings: ApiSettings, resolver: Resolver | None
) -> tuple[_DirectoryKeys, httpx.Headers]:
    try:
        target = await check_target(url, settings, resolver=resolver)
    except TargetRefused as exc:
        raise _DirectoryUnavailable(
            f"the agent's key directory is not a permitted address ({exc.reason})"
        ) from None
    try:
        document = await fetch_document(
            target, settings, accept=_ACCEPT, max_bytes=MAX_DIRECTORY_BYTES, seconds=FETCH_TIMEOUT_SECONDS
        )
    except DocumentUnavailable as exc:
        raise _DirectoryUnavailable(_unavailable(exc)) from None
    try:
        return _DirectoryKeys(JWKS.from_json(document.body)), document.headers
    except ValueError:
        raise _DirectoryUnavailable("the agent's key directory is not a JWKS document") from None


def _unavailable(exc: DocumentUnavailable) -> str:
    match exc.failure:
        case "timeout" | "unreachable":
            return "the agent's key directory could not be fetched"
        case "redirect" | "status":
            return f"the agent's key directory answered {exc.status_code}"
        case "compressed":
            return "the agent's key directory was sent compressed although identity was asked"
        case "too_large":
            return f"the agent's key directory is larger than {MAX_DIRECTORY_BYTES} bytes"
