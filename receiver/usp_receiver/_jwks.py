"""Key sets: a static JWKS, a remote JWKS fetched over HTTPS with HTTP caching, and a chain of both.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver._jwks``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

import anyio
import httpx

from usp_receiver._errors import KeyFetchError
from usp_receiver._keys import KeyResolver, PublicKey

__all__ = ["DEFAULT_MAX_BYTES", "JWKS", "KeyRing", "RemoteJWKS", "cache_lifetime"]

logger = logging.getLogger("usp_receiver")

#: Largest JWKS document :class:`RemoteJWKS` reads. A real key set is a few KiB; the cap bounds
#: the memory a hostile or broken endpoint can make a receiver spend.
DEFAULT_MAX_BYTES: Final = 256 * 1024

# Keys a JWKS document may carry that we can verify with. Everything else is skipped, not fatal:
# RFC 7517 section 5 says to ignore keys one does not understand, so that a business may publish
# e.g. an encryption key or a newer curve next to its signing keys without breaking receivers.
_SUPPORTED_CURVES: Final = {"OKP": {"Ed25519"}, "EC": {"P-256"}, "RSA": None}
_ACCEPT: Final = (
    "application/jwk-set+json, application/http-message-signatures-directory+json, application/json;q=0.9"
)
_MAX_AGE = re.compile(r'^max-age\s*=\s*"?(\d+)"?$', re.IGNORECASE)


class JWKS:
    """An immutable set of trusted public keys, looked up by ``kid``; a :class:`KeyResolver`.

    Use it for keys pinned in configuration, or as the parsed form of a fetched document.

    >>> jwks = JWKS.from_dict({"keys": [{"kty": "OKP", "crv": "Ed25519",
    ...     "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}]})
    >>> "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U" in jwks, len(jwks)
    (True, 1)
    >>> jwks.get("poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U").alg
    'ed25519'
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[PublicKey] = ()) -> None:
        """Build the set; a kid bound to two different keys is refused (``ValueError``).

        Which of the two a signature meant would be a guess, and a verifier must not guess.
        """
        by_kid: dict[str, PublicKey] = {}
        for key in keys:
            known = by_kid.get(key.kid)
            if known is not None and not _same_key(known, key):
                raise ValueError(f"kid {key.kid!r} names two different keys")
            by_kid.setdefault(key.kid, key)
        self._keys: Mapping[str, PublicKey] = by_kid

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> JWKS:
        """Parse a JWK Set or Web Bot Auth directory (``{"keys": [...]}``).

        Keys we cannot or must not verify with are skipped: unsupported ``kty``/``crv``/``alg``,
        ``use`` other than ``"sig"``, ``key_ops`` without ``"verify"``, and symmetric (``oct``)
        keys, since a secret published in a public document is no secret. A document that is not
        an object with a ``keys`` array of objects raises ``ValueError``.
        """
        if not isinstance(document, Mapping):
            raise ValueError("a JWKS document must be a JSON object")
        entries = document.get("keys")
        if not isinstance(entries, list):
            raise ValueError('a JWKS document must have a "keys" array')
        keys: list[PublicKey] = []
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise ValueError(f"JWKS keys[{index}] is not an object")
            key = _usable_key(entry)
            if key is not None:
                keys.append(key)
        return cls(keys)

    @classmethod
    def from_json(cls, text: str | bytes) -> JWKS:
        """Parse a JSON JWKS document; ``ValueError`` when it is not JSON or not a JWKS."""
        try:
            document = json.loads(text)
        except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"JWKS is not valid JSON: {exc}") from exc
        return cls.from_dict(document)

    @classmethod
    def from_file(cls, path: str | Path) -> JWKS:
        """Read a JWKS document from a file, e.g. keys pinned next to the receiver's config."""
        return cls.from_json(Path(path).read_bytes())

    def to_dict(self) -> dict[str, Any]:
        """The set as a JWKS document holding public members only (plus ``kid`` and ``alg``).

        Symmetric keys are left out: their only member is the secret itself.
        """
        return {"keys": [dict(key.jwk) | {"kid": key.kid} for key in self if key.jwk.get("kty") != "oct"]}

    def get(self, kid: str) -> PublicKey | None:
        """The key named ``kid``, or ``None``."""
        return self._keys.get(kid)

    def resolve(self, kid: str) -> PublicKey | None:
        """:class:`KeyResolver` lookup; a static set never fetches."""
        return self._keys.get(kid)

    async def aresolve(self, kid: str) -> PublicKey | None:
        """Async :class:`KeyResolver` lookup; the same as :meth:`resolve`."""
        return self._keys.get(kid)

    def __iter__(self) -> Iterator[PublicKey]:
        return iter(self._keys.values())

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, kid: object) -> bool:
        return kid in self._keys

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JWKS):
            return NotImplemented
        return self._keys.keys() == other._keys.keys() and all(
            _same_key(key, other._keys[kid]) for kid, key in self._keys.items()
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JWKS(kids={list(self._keys)!r})"


def _same_key(a: PublicKey, b: PublicKey) -> bool:
    return a.kid == b.kid and a.alg == b.alg and dict(a.jwk) == dict(b.jwk)


def _usable_key(jwk: Mapping[str, Any]) -> PublicKey | None:
    """The verification key ``jwk`` describes, or ``None`` when it is not one we may use."""
    kty = jwk.get("kty")
    if not isinstance(kty, str) or kty not in _SUPPORTED_CURVES:
        return None
    curves = _SUPPORTED_CURVES[kty]
    if curves is not None and jwk.get("crv") not in curves:
        return None
    if "use" in jwk and jwk["use"] != "sig":
        return None
    ops = jwk.get("key_ops")
    if ops is not None and (not isinstance(ops, list) or "verify" not in ops):
        return None
    try:
        return PublicKey.from_jwk(jwk)
    except ValueError:
        # Unsupported alg, an RSA key without alg, bad coordinates: not ours to verify with.
        return None


def cache_lifetime(headers: httpx.Headers, *, default: float, minimum: float, maximum: float) -> float:
    """Seconds a response stays fresh, per RFC 9111 ``max-age`` and ``Age``, clamped to
    ``[minimum, maximum]``; ``default`` without ``max-age``, ``minimum`` under ``no-store`` or
    ``no-cache``.

    >>> cache_lifetime(httpx.Headers({"Cache-Control": "public, max-age=600", "Age": "100"}),
    ...                default=300, minimum=30, maximum=3600)
    500.0
    """
    directives = [d.strip() for d in ",".join(headers.get_list("cache-control")).split(",")]
    if any(d.lower() in {"no-store", "no-cache"} for d in directives):
        return minimum
    lifetime = default
    for directive in directives:
        match = _MAX_AGE.match(directive)
        if match:
            lifetime = float(match.group(1))
            break
    age = headers.get("age", "")
    if age.isdigit():
        lifetime -= float(age)
    return min(max(lifetime, minimum), maximum)


class RemoteJWKS:
    """A :class:`KeyResolver` over a JWKS URL, cached as HTTP says, refetched on key rotation.

    * Freshness follows ``Cache-Control: max-age`` (minus ``Age``), clamped to
      ``[min_refresh_interval, max_max_age]``; without it, ``default_max_age``. Refreshes are
      conditional (``If-None-Match``/``If-Modified-Since``) and a ``304`` renews the cached keys.
    * An unknown kid triggers one refetch, at most once per ``min_refresh_interval``; concurrent
      misses share that fetch.
    * A failed refresh (network error, non-2xx, redirect, oversized or invalid body) keeps the
      cached keys in service and is retried after ``min_refresh_interval``. Without a cached copy
      the lookup raises :class:`KeyFetchError`.
    * Only ``https`` URLs, unless ``allow_insecure_http=True`` (local tests).

    ``timeout`` bounds each fetch; it configures the clients this object builds, while a client you
    pass keeps its own timeouts. Clients you pass are never closed here. Use one instance per
    event loop for async lookups.

    >>> keys = RemoteJWKS("https://business.example/.well-known/usp/jwks.json")  # doctest: +SKIP
    >>> with keys:  # doctest: +SKIP
    ...     key = keys.resolve("poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U")
    """

    def __init__(
        self,
        url: str,
        *,
        client: httpx.Client | None = None,
        async_client: httpx.AsyncClient | None = None,
        min_refresh_interval: float = 30.0,
        default_max_age: float = 300.0,
        max_max_age: float = 86400.0,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        allow_insecure_http: bool = False,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        parsed = httpx.URL(url)
        allowed = {"https", "http"} if allow_insecure_http else {"https"}
        if parsed.scheme not in allowed or not parsed.host:
            raise ValueError(
                f"JWKS URL must be https (got {url!r}); plain http only with allow_insecure_http=True"
            )
        if not 0 <= min_refresh_interval <= max_max_age:
            raise ValueError("need 0 <= min_refresh_interval <= max_max_age")
        self.url = str(parsed)
        self.min_refresh_interval = float(min_refresh_interval)
        self.default_max_age = float(default_max_age)
        self.max_max_age = float(max_max_age)
        self.timeout = float(timeout)
        self.max_bytes = int(max_bytes)
        self._clock = clock
        self._client = client
        self._async_client = async_client
        self._owns_client = client is None
        self._owns_async_client = async_client is None
        self._lock = threading.Lock()
        self._async_lock = anyio.Lock()
        self._jwks: JWKS | None = None
        self._etag: str | None = None
        self._last_modified: str | None = None
        self._fresh_until = 0.0
        self._last_attempt: float | None = None
        self._last_error: str | None = None

    # -- public API -------------------------------------------------------------------------------

    def keys(self) -> JWKS:
        """The current key set, fetched or refreshed first when it is missing or stale."""
        if self._fresh():
            return self._require()
        with self._lock:
            if not self._fresh():
                self._fetch(force=False)
            return self._require()

    async def akeys(self) -> JWKS:
        """Async :meth:`keys`."""
        if self._fresh():
            return self._require()
        async with self._async_lock:
            if not self._fresh():
                await self._afetch(force=False)
            return self._require()

    def refresh(self, force: bool = False) -> JWKS:
        """Refetch when stale, or now with ``force=True`` (an operator's call, so not rate-limited)."""
        if not force:
            return self.keys()
        with self._lock:
            self._fetch(force=True)
            return self._require()

    async def arefresh(self, force: bool = False) -> JWKS:
        """Async :meth:`refresh`."""
        if not force:
            return await self.akeys()
        async with self._async_lock:
            await self._afetch(force=True)
            return self._require()

    def resolve(self, kid: str) -> PublicKey | None:
        """The key named ``kid``; ``None`` when even a (rate-limited) refetch does not have it."""
        key = self.keys().get(kid)
        if key is not None:
            return key
        with self._lock:
            # Whoever held the lock before us may just have fetched; then the rate limit says no.
            if self._may_refetch():
                self._fetch(force=True)
            return self._require().get(kid)

    async def aresolve(self, kid: str) -> PublicKey | None:
        """Async :meth:`resolve`; the event loop never blocks on the network."""
        key = (await self.akeys()).get(kid)
        if key is not None:
            return key
        async with self._async_lock:
            if self._may_refetch():
                await self._afetch(force=True)
            return self._require().get(kid)

    def close(self) -> None:
        """Close the sync client this object built (a client passed in stays open)."""
        if self._owns_client and self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Close the clients this object built, sync and async."""
        self.close()
        if self._owns_async_client and self._async_client is not None:
            await self._async_client.aclose()
            self._async_client = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"RemoteJWKS({self.url!r})"

    # -- state ------------------------------------------------------------------------------------

    def _fresh(self) -> bool:
        return self._jwks is not None and self._clock() < self._fresh_until

    def _require(self) -> JWKS:
        if self._jwks is None:  # only reachable if a fetch path forgot to raise
            raise KeyFetchError(f"no keys from {self.url}")
        return self._jwks

    def _may_refetch(self) -> bool:
        """At most one fetch per ``min_refresh_interval`` unless the cache has expired."""
        return self._last_attempt is None or self._clock() - self._last_attempt >= self.min_refresh_interval

    def _before_fetch(self, force: bool) -> dict[str, str]:
        """Gatekeeping and conditional headers shared by the sync and async fetch."""
        if not force and self._jwks is None and not self._may_refetch():
            # The last attempt failed moments ago and we have nothing cached: do not hammer.
            raise KeyFetchError(f"JWKS {self.url} unavailable ({self._last_error}); retrying later")
        self._last_attempt = self._clock()
        headers = {"Accept": _ACCEPT, "Accept-Encoding": "identity"}
        if self._jwks is not None:
            if self._etag is not None:
                headers["If-None-Match"] = self._etag
            if self._last_modified is not None:
                headers["If-Modified-Since"] = self._last_modified
        return headers

    def _check_head(self, response: httpx.Response) -> None:
        if response.status_code == 304 and self._jwks is not None:
            return
        if not 200 <= response.status_code < 300:
            where = response.headers.get("location")
            detail = f", redirect to {where!r} not followed" if where and response.is_redirect else ""
            raise _FetchFailed(f"HTTP {response.status_code}{detail}")
        length = response.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            raise _FetchFailed(f"body of {length} bytes exceeds {self.max_bytes}")

    def _add_chunk(self, body: bytearray, chunk: bytes, started: float) -> None:
        body += chunk
        if len(body) > self.max_bytes:
            raise _FetchFailed(f"body exceeds {self.max_bytes} bytes")
        if time.monotonic() - started > self.timeout:
            raise _FetchFailed(f"body took longer than {self.timeout} s")

    def _accept(self, response: httpx.Response, body: bytes) -> None:
        """Install a 200's keys or a 304's renewal."""
        if response.status_code != 304:
            try:
                jwks = JWKS.from_json(body)
            except ValueError as exc:
                raise _FetchFailed(f"invalid JWKS document: {exc}") from None
            self._jwks = jwks
            self._etag = None
            self._last_modified = None
        self._etag = response.headers.get("etag", self._etag)
        self._last_modified = response.headers.get("last-modified", self._last_modified)
        self._fresh_until = self._clock() + self._lifetime(response.headers)
        self._last_error = None

    def _fail(self, reason: str) -> None:
        self._last_error = reason
        if self._jwks is None:
            raise KeyFetchError(f"cannot fetch JWKS {self.url}: {reason}")
        # Serve what we trust until the next try; the URL and reason name no key material.
        self._fresh_until = self._clock() + self.min_refresh_interval
        logger.warning(
            "JWKS refresh from %s failed (%s); serving cached keys, retrying in %.0f s",
            self.url,
            reason,
            self.min_refresh_interval,
        )

    def _lifetime(self, headers: httpx.Headers) -> float:
        return cache_lifetime(
            headers, default=self.default_max_age, minimum=self.min_refresh_interval, maximum=self.max_max_age
        )

    # -- transport --------------------------------------------------------------------------------

    def _fetch(self, *, force: bool) -> None:
        """One GET (caller holds ``_lock``); updates the cache or records the failure."""
        headers = self._before_fetch(force)
        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout)
        started = time.monotonic()
        try:
            with self._client.stream("GET", self.url, headers=headers, follow_redirects=False) as response:
                self._check_head(response)
                body = bytearray()
                for chunk in response.iter_bytes():
                    self._add_chunk(body, chunk, started)
            self._accept(response, bytes(body))
        except _FetchFailed as exc:
            self._fail(str(exc))
        except httpx.HTTPError as exc:
            self._fail(f"{type(exc).__name__}: {exc}")

    async def _afetch(self, *, force: bool) -> None:
        """Async :meth:`_fetch` (caller holds ``_async_lock``)."""
        headers = self._before_fetch(force)
        if self._async_client is None:
            self._async_client = httpx.AsyncClient(timeout=self.timeout)
        started = time.monotonic()
        try:
            async with self._async_client.stream(
                "GET", self.url, headers=headers, follow_redirects=False
            ) as response:
                self._check_head(response)
                body = bytearray()
                async for chunk in response.aiter_bytes():
                    self._add_chunk(body, chunk, started)
            self._accept(response, bytes(body))
        except _FetchFailed as exc:
            self._fail(str(exc))
        except httpx.HTTPError as exc:
            self._fail(f"{type(exc).__name__}: {exc}")


class _FetchFailed(Exception):
    """A response we will not take keys from; internal, becomes a warning or KeyFetchError."""


class KeyRing:
    """Several resolvers asked in order; the first that knows the kid wins.

    Typical use pins a key locally and falls back to the business's published set, so a rotation
    works without a config change while the pinned key keeps working if the endpoint is down.

    >>> pinned = JWKS.from_dict({"keys": [{"kty": "OKP", "crv": "Ed25519",
    ...     "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"}]})
    >>> ring = KeyRing(pinned, JWKS())
    >>> ring.resolve("poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U").alg
    'ed25519'
    """

    def __init__(self, *resolvers: KeyResolver) -> None:
        self.resolvers: tuple[KeyResolver, ...] = resolvers

    def resolve(self, kid: str) -> PublicKey | None:
        """First hit wins; an error from a later resolver propagates (it might have held the key)."""
        for resolver in self.resolvers:
            key = resolver.resolve(kid)
            if key is not None:
                return key
        return None

    async def aresolve(self, kid: str) -> PublicKey | None:
        """Async :meth:`resolve`."""
        for resolver in self.resolvers:
            key = await resolver.aresolve(kid)
            if key is not None:
                return key
        return None
