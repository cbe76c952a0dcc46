"""JWKS parsing and the remote resolver, against a real HTTP server on 127.0.0.1.

The server is uvicorn running a tiny Starlette app in a background thread; each test steers what it
serves (keys, status, caching headers, redirects, size) and reads back what it was asked.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.servers import serving
from usp_receiver._errors import KeyFetchError
from usp_receiver._jwks import JWKS, KeyRing, RemoteJWKS
from usp_receiver._keys import KeyResolver, PublicKey, SigningKey

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "rfc9421.json"
PRIVATE_MEMBERS = {"d", "p", "q", "dp", "dq", "qi", "k", "oth"}
WBA_KID = "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _vectors() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(VECTORS.read_text())
    return data


# -- the steerable server ------------------------------------------------------------------------


@dataclass
class Endpoint:
    """What the server answers at ``/jwks.json``; mutated by tests, read by the handler thread."""

    document: dict[str, Any] = field(default_factory=lambda: {"keys": []})
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    etag: str | None = None
    raw_body: bytes | None = None
    stream_bytes: int = 0
    delay: float = 0.0
    hits: Counter[str] = field(default_factory=Counter)
    requests: list[dict[str, str]] = field(default_factory=list)
    client_ports: list[int] = field(default_factory=list)

    def serve(self, *keys: SigningKey) -> None:
        self.document = JWKS(key.public for key in keys).to_dict()

    @property
    def jwks_hits(self) -> int:
        return self.hits["/jwks.json"]


@dataclass
class Server:
    base: str
    endpoint: Endpoint

    def url(self, path: str = "/jwks.json") -> str:
        return self.base + path


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _build_app(holder: list[Endpoint]) -> Starlette:
    async def jwks(request: Request) -> Response:
        state = holder[0]
        state.hits[request.url.path] += 1
        state.requests.append(dict(request.headers))
        if request.client is not None:
            state.client_ports.append(request.client.port)
        if state.delay:
            await anyio.sleep(state.delay)
        headers = dict(state.headers)
        if state.etag is not None:
            headers["ETag"] = state.etag
            if request.headers.get("if-none-match") == state.etag:
                return Response(status_code=304, headers=headers)
        if state.stream_bytes:

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(state.stream_bytes // 1024):
                    yield b" " * 1024

            return StreamingResponse(chunks(), media_type="application/json", headers=headers)
        body = state.raw_body if state.raw_body is not None else json.dumps(state.document).encode()
        return Response(body, status_code=state.status, headers=headers, media_type="application/json")

    async def moved(request: Request) -> Response:
        holder[0].hits[request.url.path] += 1
        return RedirectResponse("/jwks.json", status_code=302)

    return Starlette(routes=[Route("/jwks.json", jwks), Route("/moved", moved)])


@pytest.fixture(scope="module")
def _running() -> Iterator[tuple[str, list[Endpoint]]]:
    holder = [Endpoint()]
    with serving(_build_app(holder)) as served:
        yield served.url, holder


@pytest.fixture
def server(_running: tuple[str, list[Endpoint]]) -> Server:
    base, holder = _running
    holder[0] = Endpoint()
    return Server(base, holder[0])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _remote(server: Server, clock: FakeClock, path: str = "/jwks.json", **kwargs: Any) -> RemoteJWKS:
    return RemoteJWKS(server.url(path), clock=clock, allow_insecure_http=True, **kwargs)


# -- static JWKS -----------------------------------------------------------------------------------


def test_static_jwks_loads_rfc9421_ed25519_and_p256_keys_that_verify_the_rfc_signatures() -> None:
    vectors = _vectors()
    jwks = JWKS.from_dict({"keys": [entry["jwk"] for entry in vectors["keys"].values() if "jwk" in entry]})

    assert jwks.get("test-key-ed25519") is not None
    assert jwks.get("test-key-ed25519").alg == "ed25519"  # type: ignore[union-attr]
    assert jwks.get("test-key-ecc-p256").alg == "ecdsa-p256-sha256"  # type: ignore[union-attr]
    # The RFC's RSA JWKs carry no "alg", and guessing PSS vs v1.5 is refused: skipped, not fatal.
    assert "test-key-rsa" not in jwks
    assert "test-key-rsa-pss" not in jwks
    assert sorted(key.kid for key in jwks) == ["test-key-ecc-p256", "test-key-ed25519"]
    assert len(jwks) == 2

    for case in vectors["cases"]:
        if case["key_id"] in jwks:
            key = jwks.get(case["key_id"])
            assert key is not None
            signature = base64.b64decode(case["expected_signature_b64"])
            assert key.verify(signature, case["signature_base"].encode()), case["id"]
            assert not key.verify(signature, case["signature_base"].encode() + b"x"), case["id"]


def test_to_dict_publishes_public_members_only() -> None:
    vectors = _vectors()
    private_jwks = [entry["jwk"] for entry in vectors["keys"].values() if "jwk" in entry]
    assert any("d" in jwk for jwk in private_jwks)  # the input really holds private keys
    jwks = JWKS.from_dict({"keys": private_jwks})

    document = jwks.to_dict()

    assert len(document["keys"]) == 2
    for jwk in document["keys"]:
        assert not PRIVATE_MEMBERS & set(jwk), jwk
        assert jwk["kid"] in {"test-key-ed25519", "test-key-ecc-p256"}
        assert jwk["alg"] in {"EdDSA", "ES256"}
    assert JWKS.from_dict(document) == jwks  # round-trips
    for jwk in private_jwks:
        if "d" in jwk:
            assert jwk["d"] not in json.dumps(document)
            assert jwk["d"] not in repr(jwks)


def test_to_dict_leaves_out_symmetric_keys() -> None:
    hmac = PublicKey.from_jwk({"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ"})
    ed = SigningKey.generate().public
    assert JWKS([hmac, ed]).to_dict() == {"keys": [dict(ed.jwk) | {"kid": ed.kid}]}


def test_from_dict_skips_keys_it_must_not_use() -> None:
    good = SigningKey.generate().public
    p384 = {"kty": "EC", "crv": "P-384", "x": "AA", "y": "AA"}
    document = {
        "keys": [
            dict(good.jwk),
            dict(SigningKey.generate().public.jwk) | {"use": "enc"},
            dict(SigningKey.generate().public.jwk) | {"key_ops": ["encrypt"]},
            {"kty": "OKP", "crv": "X25519", "x": "JrQLj5P_89iXES9-vFgrIy29clF9CC_oPPsw3c5D0bs"},
            p384,
            {"kty": "oct", "k": "c2VjcmV0"},
            {"kty": "RSA", "n": "AQAB", "e": "AQAB"},  # no alg: refused
            dict(SigningKey.generate().public.jwk) | {"alg": "HS512"},
            {"kty": "OKP", "crv": "Ed25519", "x": "not base64url!"},
            {"kty": "future-kty"},
            {"no": "kty"},
        ]
    }
    jwks = JWKS.from_dict(document)
    assert [key.kid for key in jwks] == [good.kid]
    assert JWKS.from_dict({"keys": [dict(good.jwk) | {"use": "sig", "key_ops": ["verify"]}]}).get(good.kid)


@pytest.mark.parametrize(
    "document",
    [
        [],
        "keys",
        {},
        {"keys": None},
        {"keys": {"kty": "OKP"}},
        {"keys": ["not an object"]},
    ],
)
def test_from_dict_refuses_malformed_documents(document: Any) -> None:
    with pytest.raises(ValueError, match="JWKS"):
        JWKS.from_dict(document)


def test_a_kid_naming_two_keys_is_refused_but_exact_duplicates_collapse() -> None:
    a, b = SigningKey.generate().public, SigningKey.generate().public
    clash = dict(b.jwk) | {"kid": "same"}
    with pytest.raises(ValueError, match="two different keys"):
        JWKS.from_dict({"keys": [dict(a.jwk) | {"kid": "same"}, clash]})
    assert len(JWKS([a, a])) == 1


def test_from_json_and_from_file(tmp_path: Path) -> None:
    key = SigningKey.generate("ecdsa-p256-sha256").public
    text = json.dumps(JWKS([key]).to_dict())
    path = tmp_path / "jwks.json"
    path.write_text(text)

    for jwks in (
        JWKS.from_json(text),
        JWKS.from_json(text.encode()),
        JWKS.from_file(path),
        JWKS.from_file(str(path)),
    ):
        assert key.kid in jwks
        assert jwks.get(key.kid) == key
    with pytest.raises(ValueError, match="not valid JSON"):
        JWKS.from_json("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        JWKS.from_json(b"\xff\xfe")


def test_web_bot_auth_directory_document_is_a_jwks() -> None:
    vectors = _vectors()
    [directory] = [v for v in vectors["web_bot_auth_vectors"] if v["name"] == "wba-signed-directory-response"]

    jwks = JWKS.from_json(directory["response_body"])

    key = jwks.get(WBA_KID)
    assert key is not None
    assert key.alg == "ed25519"
    assert key.jwk["x"] == vectors["keys"]["test-key-ed25519"]["jwk"]["x"]


@pytest.mark.anyio
async def test_static_jwks_is_a_key_resolver() -> None:
    key = SigningKey.generate().public
    jwks = JWKS([key])
    assert isinstance(jwks, KeyResolver)
    assert jwks.resolve(key.kid) is key
    assert await jwks.aresolve(key.kid) is key
    assert jwks.resolve("nope") is None
    assert await jwks.aresolve("nope") is None
    assert key.kid in jwks
    assert "nope" not in jwks
    assert list(jwks) == [key]
    assert key.kid in repr(jwks)


# -- RemoteJWKS: URL policy --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "insecure"),
    [
        ("http://127.0.0.1/jwks.json", False),
        ("http://business.example/.well-known/usp/jwks.json", False),
        ("ftp://business.example/jwks.json", True),
        ("file:///etc/jwks.json", True),
        ("/relative/jwks.json", True),
    ],
)
def test_only_https_urls_unless_insecure_http_is_allowed(url: str, insecure: bool) -> None:
    with pytest.raises(ValueError, match="https"):
        RemoteJWKS(url, allow_insecure_http=insecure)


def test_https_and_opted_in_http_urls_are_accepted() -> None:
    with RemoteJWKS("https://business.example/.well-known/usp/jwks.json") as remote:
        assert remote.url == "https://business.example/.well-known/usp/jwks.json"
    with RemoteJWKS("http://127.0.0.1:1/jwks.json", allow_insecure_http=True) as remote:
        assert remote.url.startswith("http://")


# -- RemoteJWKS: fetching and rotation -------------------------------------------------------------


def test_fetches_once_and_serves_known_kids_from_cache(server: Server, clock: FakeClock) -> None:
    old = SigningKey.generate()
    server.endpoint.serve(old)
    with _remote(server, clock) as remote:
        assert isinstance(remote, KeyResolver)
        assert server.endpoint.jwks_hits == 0  # lazy: nothing fetched before first use
        assert remote.resolve(old.kid) == old.public
        assert remote.resolve(old.kid) == old.public
        assert remote.keys().get(old.kid) == old.public
        assert server.endpoint.jwks_hits == 1
        assert "application/jwk-set+json" in server.endpoint.requests[0]["accept"]


def test_unknown_kid_refetches_once_then_is_rate_limited(server: Server, clock: FakeClock) -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    server.endpoint.serve(old)
    with _remote(server, clock, min_refresh_interval=30) as remote:
        assert remote.resolve(old.kid) is not None
        # A kid missing right after the first fetch: we just asked, so no second request.
        assert remote.resolve(new.kid) is None
        assert server.endpoint.jwks_hits == 1

        clock.advance(31)
        server.endpoint.serve(old, new)  # the business rotates a key in
        assert remote.resolve(new.kid) == new.public
        assert server.endpoint.jwks_hits == 2

        # A sprayer's random kid within min_refresh_interval: answered from cache, no request.
        assert remote.resolve("random-kid-1") is None
        clock.advance(29)
        assert remote.resolve("random-kid-2") is None
        assert server.endpoint.jwks_hits == 2

        clock.advance(1)
        assert remote.resolve("random-kid-3") is None
        assert server.endpoint.jwks_hits == 3
        assert remote.resolve(old.kid) == old.public  # still trusted


def test_concurrent_misses_share_one_fetch(server: Server, clock: FakeClock) -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    server.endpoint.serve(old)
    with _remote(server, clock) as remote:
        remote.keys()
        clock.advance(60)
        server.endpoint.serve(old, new)
        server.endpoint.delay = 0.2
        results: list[PublicKey | None] = []
        threads = [threading.Thread(target=lambda: results.append(remote.resolve(new.kid))) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [new.public] * 8
        assert server.endpoint.jwks_hits == 2


def test_concurrent_lookups_of_an_expired_set_share_one_fetch(server: Server, clock: FakeClock) -> None:
    key = SigningKey.generate()
    server.endpoint.serve(key)
    with _remote(server, clock) as remote:
        remote.keys()
        clock.advance(301)
        server.endpoint.delay = 0.2
        results: list[PublicKey | None] = []
        threads = [threading.Thread(target=lambda: results.append(remote.resolve(key.kid))) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [key.public] * 8
        assert server.endpoint.jwks_hits == 2


def test_builds_its_client_once_and_reuses_the_connection(server: Server, clock: FakeClock) -> None:
    server.endpoint.serve(SigningKey.generate())
    with _remote(server, clock) as remote:
        for _ in range(3):
            remote.refresh(force=True)
        assert server.endpoint.jwks_hits == 3
        assert len(set(server.endpoint.client_ports)) == 1


def test_refresh_force_bypasses_the_rate_limit_and_plain_refresh_does_not_fetch_fresh_keys(
    server: Server, clock: FakeClock
) -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    server.endpoint.serve(old)
    with _remote(server, clock) as remote:
        remote.refresh()
        server.endpoint.serve(new)
        assert old.kid in remote.refresh()
        assert server.endpoint.jwks_hits == 1
        assert list(remote.refresh(force=True)) == [new.public]
        assert server.endpoint.jwks_hits == 2


# -- RemoteJWKS: HTTP caching ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache_control", "fresh_for"),
    [
        ("public, max-age=100", 100),
        ("max-age=1", 30),  # below min_refresh_interval: clamped up
        ("max-age=999999999", 1000),  # above max_max_age: clamped down
        ("no-store", 30),
        ("no-cache, max-age=600", 30),
        (None, 300),  # default_max_age
    ],
)
def test_cache_control_max_age_sets_freshness(
    server: Server, clock: FakeClock, cache_control: str | None, fresh_for: float
) -> None:
    key = SigningKey.generate()
    server.endpoint.serve(key)
    if cache_control is not None:
        server.endpoint.headers["Cache-Control"] = cache_control
    with _remote(server, clock, min_refresh_interval=30, default_max_age=300, max_max_age=1000) as remote:
        remote.resolve(key.kid)
        clock.advance(fresh_for - 0.5)
        remote.resolve(key.kid)
        assert server.endpoint.jwks_hits == 1
        clock.advance(1)
        remote.resolve(key.kid)
        assert server.endpoint.jwks_hits == 2


def test_age_header_shortens_freshness(server: Server, clock: FakeClock) -> None:
    key = SigningKey.generate()
    server.endpoint.serve(key)
    server.endpoint.headers.update({"Cache-Control": "max-age=100", "Age": "60"})
    with _remote(server, clock, min_refresh_interval=10) as remote:
        remote.keys()
        clock.advance(41)
        remote.keys()
        assert server.endpoint.jwks_hits == 2


def test_etag_revalidation_304_keeps_keys_and_renews_freshness(server: Server, clock: FakeClock) -> None:
    key = SigningKey.generate()
    server.endpoint.serve(key)
    server.endpoint.etag = '"v1"'
    server.endpoint.headers.update(
        {"Cache-Control": "max-age=100", "Last-Modified": "Tue, 20 Apr 2021 02:07:55 GMT"}
    )
    with _remote(server, clock) as remote:
        first = remote.keys()
        assert "if-none-match" not in server.endpoint.requests[0]
        clock.advance(101)

        assert remote.resolve(key.kid) == key.public
        assert server.endpoint.jwks_hits == 2
        conditional = server.endpoint.requests[1]
        assert conditional["if-none-match"] == '"v1"'
        assert conditional["if-modified-since"] == "Tue, 20 Apr 2021 02:07:55 GMT"
        assert remote.keys() is first  # 304: the same keys

        clock.advance(99)  # freshness renewed by the 304's max-age
        remote.keys()
        assert server.endpoint.jwks_hits == 2
        clock.advance(2)
        remote.keys()
        assert server.endpoint.jwks_hits == 3


def test_new_etag_replaces_keys(server: Server, clock: FakeClock) -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    server.endpoint.serve(old)
    server.endpoint.etag = '"v1"'
    with _remote(server, clock) as remote:
        remote.keys()
        server.endpoint.serve(new)
        server.endpoint.etag = '"v2"'
        clock.advance(301)
        assert list(remote.keys()) == [new.public]
        remote.refresh(force=True)
        assert server.endpoint.requests[-1]["if-none-match"] == '"v2"'


# -- RemoteJWKS: failures -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "break_server",
    [
        pytest.param(lambda e: setattr(e, "status", 500), id="500"),
        pytest.param(lambda e: setattr(e, "raw_body", b"<html>oops</html>"), id="not-json"),
        pytest.param(lambda e: setattr(e, "raw_body", b'{"keys": 3}'), id="not-jwks"),
        pytest.param(lambda e: setattr(e, "raw_body", b" " * 300_000), id="too-big"),
    ],
)
def test_failed_refresh_serves_stale_keys_and_retries_later(
    server: Server, clock: FakeClock, caplog: pytest.LogCaptureFixture, break_server: Any
) -> None:
    key = SigningKey.generate()
    server.endpoint.serve(key)
    with _remote(server, clock, min_refresh_interval=30) as remote:
        remote.keys()
        clock.advance(301)
        break_server(server.endpoint)

        with caplog.at_level(logging.WARNING, logger="usp_receiver"):
            assert remote.resolve(key.kid) == key.public
        assert server.endpoint.jwks_hits == 2
        [record] = [r for r in caplog.records if r.name == "usp_receiver"]
        assert record.levelno == logging.WARNING
        assert "serving cached keys" in record.getMessage()
        assert str(key.public.jwk["x"]) not in caplog.text

        clock.advance(29)  # no retry before min_refresh_interval, even for unknown kids
        assert remote.resolve(key.kid) == key.public
        assert remote.resolve("unknown") is None
        assert server.endpoint.jwks_hits == 2

        clock.advance(2)
        assert remote.resolve(key.kid) == key.public
        assert server.endpoint.jwks_hits == 3


def test_streamed_body_over_the_size_cap_is_refused(server: Server, clock: FakeClock) -> None:
    server.endpoint.stream_bytes = 64 * 1024
    with _remote(server, clock, max_bytes=16 * 1024) as remote, pytest.raises(KeyFetchError, match="exceeds"):
        remote.keys()  # chunked: no Content-Length to refuse it early, the read itself must stop
    assert server.endpoint.jwks_hits == 1


def test_declared_content_length_over_the_cap_is_refused_before_reading(
    server: Server, clock: FakeClock
) -> None:
    server.endpoint.raw_body = b" " * 300_000
    with _remote(server, clock) as remote, pytest.raises(KeyFetchError, match="body of 300000 bytes"):
        remote.keys()


def test_first_fetch_failing_raises_and_is_rate_limited(server: Server, clock: FakeClock) -> None:
    key = SigningKey.generate()
    server.endpoint.serve(key)
    server.endpoint.status = 500
    with _remote(server, clock, min_refresh_interval=30) as remote:
        with pytest.raises(KeyFetchError, match="HTTP 500") as info:
            remote.resolve(key.kid)
        assert info.value.reason == "key_fetch_failed"
        with pytest.raises(KeyFetchError):
            remote.keys()
        assert server.endpoint.jwks_hits == 1  # the failure is not retried at once

        server.endpoint.status = 200
        clock.advance(30)
        assert remote.resolve(key.kid) == key.public
        assert server.endpoint.jwks_hits == 2


def test_unreachable_server_raises_key_fetch_error(clock: FakeClock) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        RemoteJWKS(f"http://127.0.0.1:{port}/jwks.json", allow_insecure_http=True, clock=clock) as remote,
        pytest.raises(KeyFetchError, match="ConnectError"),
    ):
        remote.resolve("anything")


def test_redirect_is_refused_even_with_a_redirect_following_client(server: Server, clock: FakeClock) -> None:
    server.endpoint.serve(SigningKey.generate())
    with _remote(server, clock, path="/moved") as remote, pytest.raises(KeyFetchError, match="302"):
        remote.keys()
    with (
        httpx.Client(follow_redirects=True) as client,
        _remote(server, clock, path="/moved", client=client) as remote,
        pytest.raises(KeyFetchError, match="not followed"),
    ):
        remote.keys()
    assert server.endpoint.hits["/moved"] == 2
    assert server.endpoint.jwks_hits == 0


def test_close_leaves_a_caller_supplied_client_open(server: Server, clock: FakeClock) -> None:
    server.endpoint.serve(SigningKey.generate())
    with httpx.Client() as client:
        with _remote(server, clock, client=client) as remote:
            remote.keys()
        assert not client.is_closed
    assert server.endpoint.jwks_hits == 1


# -- RemoteJWKS: async ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_async_rotation_and_rate_limit(server: Server, clock: FakeClock) -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    server.endpoint.serve(old)
    async with _remote(server, clock) as remote:
        assert await remote.aresolve(old.kid) == old.public
        clock.advance(31)
        server.endpoint.serve(old, new)
        assert await remote.aresolve(new.kid) == new.public
        assert await remote.aresolve("random") is None
        assert server.endpoint.jwks_hits == 2
        assert (await remote.akeys()).get(new.kid) == new.public
        assert new.kid in await remote.arefresh(force=True)
        assert server.endpoint.jwks_hits == 3


@pytest.mark.anyio
async def test_async_concurrent_misses_share_one_fetch(server: Server, clock: FakeClock) -> None:
    old, new = SigningKey.generate(), SigningKey.generate()
    server.endpoint.serve(old)
    async with _remote(server, clock) as remote:
        await remote.arefresh()
        clock.advance(60)
        server.endpoint.serve(old, new)
        server.endpoint.delay = 0.2
        results: list[PublicKey | None] = []

        async def lookup() -> None:
            results.append(await remote.aresolve(new.kid))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(lookup)
        assert results == [new.public] * 8
        assert server.endpoint.jwks_hits == 2


@pytest.mark.anyio
async def test_async_304_and_stale_on_error(server: Server, clock: FakeClock) -> None:
    key = SigningKey.generate()
    server.endpoint.serve(key)
    server.endpoint.etag = '"v1"'
    async with _remote(server, clock) as remote:
        first = await remote.akeys()
        clock.advance(301)
        assert await remote.akeys() is first
        assert server.endpoint.requests[-1]["if-none-match"] == '"v1"'
        clock.advance(301)
        server.endpoint.etag = None
        server.endpoint.status = 503
        assert await remote.aresolve(key.kid) == key.public
        assert server.endpoint.jwks_hits == 3


@pytest.mark.anyio
async def test_async_first_fetch_failure_and_redirect(server: Server, clock: FakeClock) -> None:
    server.endpoint.status = 500
    async with _remote(server, clock) as remote:
        with pytest.raises(KeyFetchError, match="500"):
            await remote.aresolve("kid")
    async with _remote(server, clock, path="/moved") as remote:
        with pytest.raises(KeyFetchError, match="302"):
            await remote.akeys()
    assert server.endpoint.jwks_hits == 1


@pytest.mark.anyio
async def test_async_close_leaves_a_caller_supplied_client_open(server: Server, clock: FakeClock) -> None:
    server.endpoint.serve(SigningKey.generate())
    async with httpx.AsyncClient() as client:
        async with _remote(server, clock, async_client=client) as remote:
            await remote.akeys()
        assert not client.is_closed


# -- KeyRing -------------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_key_ring_first_hit_wins_and_falls_through_to_remote(server: Server, clock: FakeClock) -> None:
    pinned, remote_only = SigningKey.generate(), SigningKey.generate()
    # The remote also publishes a different key under the pinned kid: the pinned one must win.
    impostor = PublicKey.from_jwk(dict(SigningKey.generate().public.jwk) | {"kid": pinned.kid})
    server.endpoint.document = JWKS([impostor, remote_only.public]).to_dict()
    async with _remote(server, clock) as remote:
        ring = KeyRing(JWKS([pinned.public]), remote)
        assert isinstance(ring, KeyResolver)
        assert ring.resolve(pinned.kid) == pinned.public
        assert server.endpoint.jwks_hits == 0  # the pinned key answered; no fetch
        assert ring.resolve(remote_only.kid) == remote_only.public
        assert await ring.aresolve(pinned.kid) == pinned.public
        assert await ring.aresolve(remote_only.kid) == remote_only.public
        assert ring.resolve("nobody") is None
        assert await ring.aresolve("nobody") is None
        assert KeyRing(remote).resolve(pinned.kid) == impostor
