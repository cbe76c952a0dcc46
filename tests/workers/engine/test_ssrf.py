"""The SSRF guard: every non-global target is refused at registration and at delivery.

There is no DNS here, so a name that "resolves to 127.0.0.1" is made honest by injecting a
resolver; the real system resolver is exercised on ``localhost``. Only ``127.0.0.1`` is ever
contacted: public addresses appear in checks, never in a connection.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.servers import serving
from usp_core.origin_pool import OriginTransport, PinnedClient
from usp_core.ssrf import (
    ResolvedTarget,
    Resolver,
    TargetRefused,
    address_allowed,
    address_class,
    check_target,
    check_target_sync,
    default_resolver,
    default_sync_resolver,
    new_client,
    send_pinned,
)
from usp_dispatcher.cli.config import Settings
from usp_workers.engine.transport import FAILURES, connect_failure

pytestmark = pytest.mark.anyio

PUBLIC_V4 = "93.184.216.34"
PUBLIC_V6 = "2606:2800:220:1:248:1893:25c8:1946"
TIMEOUT = httpx.Timeout(5.0)


def _settings(
    *, allow: bool = False, allowlist: tuple[str, ...] = (), connect_timeout: float = 5.0
) -> Settings:
    # Every field this module reads is explicit, so a developer's USP_* environment or .env
    # cannot open (or close) the policy under the tests.
    return Settings(
        allow_private_targets=allow,
        private_target_allowlist=allowlist,
        connect_timeout=connect_timeout,
    )


STRICT = _settings()


def _resolver(table: dict[str, list[str]]) -> Resolver:
    """A DNS stand-in: names not in ``table`` do not exist (like NXDOMAIN)."""

    async def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return list(table[host])

    return resolve


def _sync(resolver: Resolver) -> Callable[[str, int], list[str]]:
    def resolve(host: str, port: int) -> list[str]:
        return anyio.run(resolver, host, port)

    return resolve


Checker = Callable[[str, Settings, Resolver | None], Awaitable[ResolvedTarget]]


async def _check_async(url: str, settings: Settings, resolver: Resolver | None) -> ResolvedTarget:
    return await check_target(url, settings, resolver=resolver)


async def _check_sync(url: str, settings: Settings, resolver: Resolver | None) -> ResolvedTarget:
    sync_resolver = None if resolver is None else _sync(resolver)
    return await anyio.to_thread.run_sync(lambda: check_target_sync(url, settings, resolver=sync_resolver))


@pytest.fixture(params=[_check_async, _check_sync], ids=["async", "sync"])
def check(request: pytest.FixtureRequest) -> Checker:
    """Both entry points (the async one for workers, the sync one for sync callers)."""
    checker: Checker = request.param
    return checker


async def _refused(
    check: Checker, url: str, reason: str, settings: Settings = STRICT, resolver: Resolver | None = None
) -> TargetRefused:
    # A resolver that knows no name: a literal must be refused without DNS, not by NXDOMAIN.
    with pytest.raises(TargetRefused) as info:
        await check(url, settings, resolver or _resolver({}))
    assert info.value.reason == reason, str(info.value)
    return info.value


# -- literal addresses ---------------------------------------------------------------------------

NON_GLOBAL_LITERALS = [
    ("127.0.0.1", "loopback"),
    ("127.255.255.254", "loopback"),
    ("10.0.0.1", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.255", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "CGNAT"),
    ("100.127.255.254", "CGNAT"),
    ("0.0.0.0", "unspecified"),
    ("0.1.2.3", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("255.255.255.255", "broadcast"),
    ("240.0.0.1", "reserved"),
    ("192.0.0.8", "IETF"),
    ("192.0.2.1", "documentation"),
    ("198.51.100.7", "documentation"),
    ("203.0.113.9", "documentation"),
    ("198.18.0.1", "benchmarking"),
    ("[::1]", "loopback"),
    ("[::]", "unspecified"),
    ("[fc00::1]", "unique-local"),
    ("[fd12::1]", "unique-local"),
    ("[fec0::1]", "site-local"),
    ("[ff02::1]", "multicast"),
    ("[ff0e::1]", "multicast"),
    ("[2001:db8::1]", "documentation"),
    ("[3fff::1]", "documentation"),
    ("[100::1]", "discard"),
    ("[::ffff:127.0.0.1]", "loopback (IPv4-mapped)"),
    ("[::ffff:10.0.0.1]", "private (IPv4-mapped)"),
    ("[::ffff:7f00:1]", "loopback (IPv4-mapped)"),
    ("[::127.0.0.1]", "loopback (IPv4-compatible)"),
    ("[::8.8.8.8]", "IPv4-compatible"),
    ("[64:ff9b::7f00:1]", "loopback (embedded in NAT64)"),
    ("[64:ff9b:1::1]", "local-use NAT64"),
    ("[2002:7f00:1::]", "loopback (embedded in 6to4)"),
    ("[2002:a00:1::1]", "private (embedded in 6to4)"),
    ("[2001:0:4136:e378:8000:63bf:3fff:fdd2]", "Teredo"),
    ("[4000::1]", "reserved"),
]


@pytest.mark.parametrize(("host", "class_name"), NON_GLOBAL_LITERALS)
async def test_a_non_global_literal_address_is_refused_naming_its_class(
    check: Checker, host: str, class_name: str
) -> None:
    url = f"https://{host}:8443/hook?token=s3cret"
    refused = await _refused(check, url, "private_address")
    assert class_name in str(refused)
    assert "s3cret" not in str(refused)  # the message never carries the query (or a path secret)


@pytest.mark.parametrize(
    "url",
    [
        "http://2130706433/",  # decimal
        "http://0x7f.1/",  # hex + short form
        "http://0x7f000001/",
        "http://017700000001/",  # octal
        "http://0177.1/",
        "http://127.1/",  # short form
        "http://127.0.1/",
        "http://127.0.0.1./",  # trailing dot
        "http://0/",  # 0.0.0.0
        "http://0xA.1/",  # 10.0.0.1, upper case hex
        "http://3232235777/",  # 192.168.1.1
        "http://[::ffff:127.0.0.1]:80/",
    ],
)
async def test_legacy_numeric_spellings_are_read_as_the_address_they_denote(check: Checker, url: str) -> None:
    # The resolver maps each spelling to a *public* address: if the guard treated the host as a
    # name and trusted the resolver, the target would pass. The system resolver (inet_aton) would
    # turn these into the private address instead, so they must be refused as literals.
    hostname = httpx.URL(url).host
    await _refused(check, url, "private_address", resolver=_resolver({hostname: [PUBLIC_V4]}))


@pytest.mark.parametrize(
    "url",
    [
        "http://1.2.3.4.5/",  # five numeric labels
        "http://256.1/",  # a leading part above 255
        "http://1.16777216/",  # the last part too big for the remaining bytes
        "http://example.0x/",  # ends in a number-ish label
        "http://09.1/",  # 0-prefixed but not octal
        "http://127%2e0.0.1/",  # percent-encoded host
        "http://[fe80::1%25eth0]/",  # IPv6 zone index
    ],
)
async def test_hosts_that_are_neither_a_name_nor_an_address_are_refused(check: Checker, url: str) -> None:
    await _refused(check, url, "bad_host", resolver=_resolver({httpx.URL(url).host: [PUBLIC_V4]}))


# -- URL shape -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://public.example/hook", "bad_scheme"),
        ("file:///etc/passwd", "bad_scheme"),
        ("gopher://public.example/", "bad_scheme"),
        ("ws://public.example/", "bad_scheme"),
        ("public.example/hook", "bad_scheme"),
        ("http://user:pass@public.example/hook", "credentials_in_url"),
        ("https://user@public.example/hook", "credentials_in_url"),
        ("https://:pass@public.example/hook", "credentials_in_url"),
        ("http:///hook", "no_host"),
        ("http://public.example:0/", "bad_port"),
        ("http://public.example:65536/", "bad_port"),
        ("http://[::1/", "bad_url"),
        ("http://0177.0.0.1/", "bad_url"),  # httpx itself refuses a 4-part octal spelling
    ],
)
async def test_urls_of_the_wrong_shape_are_refused(check: Checker, url: str, reason: str) -> None:
    refused = await _refused(check, url, reason, resolver=_resolver({"public.example": [PUBLIC_V4]}))
    assert "pass" not in str(refused)


async def test_credentials_are_refused_even_for_a_public_address(check: Checker) -> None:
    await _refused(check, f"https://token@{PUBLIC_V4}/", "credentials_in_url")


# -- resolution ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "addresses",
    [
        ["127.0.0.1"],
        ["::1"],
        ["::ffff:127.0.0.1"],
        ["10.0.0.1", "10.0.0.2"],
        [PUBLIC_V4, "127.0.0.1"],  # one bad among good: how rebinding hides
        ["127.0.0.1", PUBLIC_V4],
        [PUBLIC_V6, "fd00::1"],
    ],
)
async def test_a_name_resolving_to_any_non_global_address_is_refused(
    check: Checker, addresses: list[str]
) -> None:
    refused = await _refused(
        check,
        "https://rebind.example/hook",
        "private_address",
        resolver=_resolver({"rebind.example": addresses}),
    )
    assert "'rebind.example' resolves to" in str(refused)


async def test_the_real_resolver_on_localhost_is_refused() -> None:
    assert "127.0.0.1" in await default_resolver("localhost", 80) or "::1" in await default_resolver(
        "localhost", 80
    )
    with pytest.raises(TargetRefused) as info:
        await check_target("http://localhost:8080/hook", STRICT)
    assert info.value.reason == "private_address"
    assert "loopback" in str(info.value)


def test_the_real_sync_resolver_on_localhost_is_refused() -> None:
    assert {"127.0.0.1", "::1"} & set(default_sync_resolver("localhost", 80))
    with pytest.raises(TargetRefused) as info:
        check_target_sync("http://localhost/hook", STRICT)
    assert info.value.reason == "private_address"
    with pytest.raises(TargetRefused):  # whatever the resolver makes of the trailing dot
        check_target_sync("http://localhost./hook", STRICT)


async def test_a_name_that_does_not_resolve_is_refused(check: Checker) -> None:
    await _refused(check, "https://nowhere.example/", "unresolvable")
    await _refused(check, "https://empty.example/", "unresolvable", resolver=_resolver({"empty.example": []}))
    await _refused(
        check, "https://junk.example/", "unresolvable", resolver=_resolver({"junk.example": ["not-an-ip"]})
    )


async def test_a_resolver_that_hangs_is_bounded_by_the_connect_timeout() -> None:
    async def hang(host: str, port: int) -> list[str]:
        await anyio.sleep(30)
        return [PUBLIC_V4]

    started = time.monotonic()
    with pytest.raises(TargetRefused) as info:
        await check_target("https://slow.example/", _settings(connect_timeout=0.05), resolver=hang)
    assert info.value.reason == "unresolvable"
    assert time.monotonic() - started < 5


async def test_the_resolver_is_asked_for_the_idna_host_and_the_effective_port() -> None:
    asked: list[tuple[str, int]] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return [PUBLIC_V4]

    await check_target("https://Bücher.example/x", STRICT, resolver=resolve)
    await check_target("http://public.example:8080/x", STRICT, resolver=resolve)
    assert asked == [("xn--bcher-kva.example", 443), ("public.example", 8080)]


async def test_literal_addresses_skip_dns() -> None:
    async def explode(host: str, port: int) -> list[str]:
        raise AssertionError("a literal address must not be resolved")

    target = await check_target(f"http://{PUBLIC_V4}/", STRICT, resolver=explode)
    assert target.ip == PUBLIC_V4


# -- what passes ---------------------------------------------------------------------------------


async def test_a_public_name_passes_and_pins_the_checked_address(check: Checker) -> None:
    url = "https://public.example/hooks/usp?tenant=7"
    target = await check(url, STRICT, _resolver({"public.example": [PUBLIC_V4, PUBLIC_V6]}))
    assert target == ResolvedTarget(url=url, scheme="https", host="public.example", port=443, ip=PUBLIC_V4)
    assert target.authority == "public.example"


@pytest.mark.parametrize(
    ("url", "ip", "authority"),
    [
        (f"http://{PUBLIC_V4}:8080/x", PUBLIC_V4, f"{PUBLIC_V4}:8080"),
        (f"https://[{PUBLIC_V6}]/x", PUBLIC_V6, f"[{PUBLIC_V6}]"),
        (f"https://[::ffff:{PUBLIC_V4}]/x", PUBLIC_V4, f"[::ffff:{PUBLIC_V4}]"),  # mapped: the IPv4
        ("https://[64:ff9b::5db8:d822]/x", "64:ff9b::5db8:d822", "[64:ff9b::5db8:d822]"),  # NAT64 public
        ("https://[2002:5db8:d822::1]/x", "2002:5db8:d822::1", "[2002:5db8:d822::1]"),  # 6to4 public
        ("http://0x5d.0xb8.0xd8.0x22/x", PUBLIC_V4, "0x5d.0xb8.0xd8.0x22"),
        ("HTTPS://PUBLIC.example:443/x", PUBLIC_V4, "public.example"),
    ],
)
async def test_global_addresses_in_any_spelling_pass(
    check: Checker, url: str, ip: str, authority: str
) -> None:
    target = await check(url, STRICT, _resolver({"public.example": [PUBLIC_V4]}))
    assert target.ip == ip
    assert target.authority == authority


METADATA_TARGETS = [
    "http://169.254.169.254/latest/meta-data/",
    "http://169.254.0.1/",
    "http://[::ffff:169.254.169.254]/",
    "http://[::ffff:a9fe:a9fe]/",
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64
    "http://[64:ff9b::169.254.169.254]/",
    "http://[2002:a9fe:a9fe::1]/",  # 6to4
    "http://[::169.254.169.254]/",  # IPv4-compatible
    "http://[fe80::1]/",
    "http://[fd00:ec2::254]/",
    "http://168.63.129.16/",
    "http://100.100.100.200/",
    "http://0xa9fea9fe/",  # a numeric spelling of 169.254.169.254
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://METADATA.google.internal./",
    "http://metadata.goog/",
]


@pytest.mark.parametrize("url", METADATA_TARGETS)
async def test_cloud_metadata_and_link_local_targets_are_refused_always(check: Checker, url: str) -> None:
    """Neither development mode nor an allowlist covering them opens these."""
    wide_open = _settings(allow=True, allowlist=("0.0.0.0/0", "::/0"))
    for settings in (STRICT, _settings(allow=True), wide_open):
        refused = await _refused(check, url, "metadata_address", settings)
        assert "refused always" in str(refused)
    resolving = _resolver({"innocent.example": ["93.184.216.34", "169.254.169.254"]})
    await _refused(check, "http://innocent.example/", "metadata_address", wide_open, resolving)


async def test_allow_private_targets_opens_everything(check: Checker) -> None:
    settings = _settings(allow=True)
    assert (await check("http://127.0.0.1:8000/hook", settings, None)).ip == "127.0.0.1"
    target = await check("http://rebind.example/", settings, _resolver({"rebind.example": ["10.0.0.1"]}))
    assert target.ip == "10.0.0.1"
    # ...but not the rules that are not about addresses.
    await _refused(check, "ftp://127.0.0.1/", "bad_scheme", settings)
    await _refused(check, "http://u:p@127.0.0.1/", "credentials_in_url", settings)


async def test_an_allowlist_opens_just_its_ranges(check: Checker) -> None:
    settings = _settings(allowlist=("127.0.0.0/8", "fd00:1::/32"))
    assert (await check("http://127.0.0.1:8000/", settings, None)).ip == "127.0.0.1"
    assert (await check("http://[::ffff:127.0.0.2]/", settings, None)).ip == "127.0.0.2"
    assert (await check("http://[fd00:1::5]/", settings, None)).ip == "fd00:1::5"
    resolved = await check("http://dev.example/", settings, _resolver({"dev.example": ["127.0.0.1"]}))
    assert resolved.ip == "127.0.0.1"
    await _refused(check, "http://10.0.0.1/", "private_address", settings)
    await _refused(check, "http://[::1]/", "private_address", settings)
    await _refused(check, "http://[fd00:2::5]/", "private_address", settings)
    await _refused(check, "http://[64:ff9b::7f00:1]/", "private_address", settings)
    await _refused(
        check,
        "http://mixed.example/",
        "private_address",
        settings,
        _resolver({"mixed.example": ["127.0.0.1", "10.0.0.1"]}),
    )


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        (PUBLIC_V4, None),
        ("8.8.8.8", None),
        (PUBLIC_V6, None),
        ("2a00:1450:4001:80b::200e", None),
        ("127.0.0.1", "loopback"),
        ("::ffff:192.168.0.1", "private (IPv4-mapped)"),
        ("2001::1", "Teredo tunnel"),
        ("2001:10::1", "IETF protocol assignment"),
        ("::", "unspecified"),
    ],
)
def test_address_class_names_the_class(address: str, expected: str | None) -> None:
    ip = ipaddress.ip_address(address)
    assert address_class(ip) == expected
    assert address_allowed(ip, STRICT) is (expected is None)
    assert address_allowed(ip, _settings(allow=True))


# -- registration and delivery -------------------------------------------------------------------


async def test_a_name_rebound_after_registration_is_refused_at_delivery() -> None:
    answers = iter([[PUBLIC_V4], ["127.0.0.1"]])

    async def rebinding(host: str, port: int) -> list[str]:
        return next(answers)

    url = "https://rebind.example/hook"
    registered = await check_target(url, STRICT, resolver=rebinding)  # registration: looks public
    assert registered.ip == PUBLIC_V4
    with pytest.raises(TargetRefused) as info:  # delivery: checked again, now loopback
        await check_target(url, STRICT, resolver=rebinding)
    assert info.value.reason == "private_address"


# -- the pinned POST against a real server on 127.0.0.1 -----------------------------------------


@dataclass
class Seen:
    requests: list[dict[str, Any]] = field(default_factory=list)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _app(seen: Seen) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.requests.append(
            {
                "method": scope["method"],
                "raw_path": scope["raw_path"],
                "query_string": scope["query_string"],
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "body": body,
                "client": scope["client"][0],
                "client_port": scope["client"][1],
            }
        )
        path = scope["path"]
        headers: list[tuple[bytes, bytes]] = [(b"content-type", b"text/plain")]
        if path == "/redirect":
            headers.append((b"location", b"http://127.0.0.1:1/elsewhere"))
            await send({"type": "http.response.start", "status": 302, "headers": headers})
            await send({"type": "http.response.body", "body": b"moved"})
            return
        if path == "/big":
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for _ in range(64):
                await send({"type": "http.response.body", "body": b"x" * 16384, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if path == "/slow":
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            for _ in range(50):
                await send({"type": "http.response.body", "body": b".", "more_body": True})
                await anyio.sleep(0.1)
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 202, "headers": headers})
        await send({"type": "http.response.body", "body": b"accepted"})

    return app


@dataclass
class Running:
    port: int
    seen: Seen


def _run_server(seen: Seen, pki: Pki | None = None) -> Iterator[Running]:
    certfile, keyfile = (None, None) if pki is None else (pki.cert, pki.key)
    with serving(_app(seen), certfile=certfile, keyfile=keyfile) as served:
        yield Running(served.port, seen)


@pytest.fixture(scope="module")
def http_server() -> Iterator[Running]:
    yield from _run_server(Seen())


@pytest.fixture
def server(http_server: Running) -> Running:
    http_server.seen.requests.clear()
    return http_server


def _loopback_resolver(*names: str) -> Resolver:
    return _resolver({name: ["127.0.0.1"] for name in names})


DEV = _settings(allow=True)  # the test server lives on loopback


async def test_send_pinned_reaches_the_checked_address_with_the_original_host_path_and_query(
    server: Running,
) -> None:
    url = f"http://hooks.example:{server.port}/path/a%2Fb;x?q=1&e=%20x&q=2"
    # The system resolver knows no hooks.example: only the pin can make this request arrive.
    target = await check_target(url, DEV, resolver=_loopback_resolver("hooks.example"))
    headers = {"Content-Type": "application/json", "Host": "attacker.example", "X-Trace": "t1"}
    async with new_client(DEV) as client:
        response = await send_pinned(client, target, content=b'{"a":1}', headers=headers, timeout=TIMEOUT)
    assert response.status_code == 202
    assert response.content == b"accepted"
    assert not response.truncated
    [seen] = server.seen.requests
    assert seen["method"] == "POST"
    assert seen["headers"]["host"] == f"hooks.example:{server.port}"
    assert seen["raw_path"] == b"/path/a%2Fb;x"
    assert seen["query_string"] == b"q=1&e=%20x&q=2"
    assert seen["body"] == b'{"a":1}'
    assert seen["headers"]["content-type"] == "application/json"
    assert seen["headers"]["x-trace"] == "t1"
    assert seen["client"] == "127.0.0.1"
    assert response.pinned_url.host == "127.0.0.1"


async def test_send_pinned_uses_the_default_port_authority_and_ipv4_mapped_pin(server: Running) -> None:
    url = f"http://[::ffff:127.0.0.1]:{server.port}/p"
    target = await check_target(url, DEV)
    assert target.ip == "127.0.0.1"
    async with new_client(DEV) as client:
        response = await send_pinned(client, target, content=b"", headers={}, timeout=TIMEOUT)
    assert response.status_code == 202
    assert server.seen.requests[0]["headers"]["host"] == f"[::ffff:127.0.0.1]:{server.port}"


async def test_a_redirect_is_returned_as_is_and_never_followed(server: Running) -> None:
    target = await check_target(
        f"http://hooks.example:{server.port}/redirect", DEV, resolver=_loopback_resolver("hooks.example")
    )
    # Even a client that follows redirects by default must not follow this one.
    async with httpx.AsyncClient(follow_redirects=True, trust_env=False) as client:
        response = await send_pinned(client, target, content=b"{}", headers={}, timeout=TIMEOUT)
    assert response.status_code == 302
    assert response.headers["location"] == "http://127.0.0.1:1/elsewhere"
    assert response.content == b"moved"
    assert response.is_redirect
    assert [r["raw_path"] for r in server.seen.requests] == [b"/redirect"]


async def test_the_response_body_is_capped(server: Running) -> None:
    target = await check_target(f"http://127.0.0.1:{server.port}/big", DEV)
    async with new_client(DEV) as client:
        response = await send_pinned(
            client, target, content=b"", headers={}, timeout=TIMEOUT, max_response_bytes=1000
        )
    assert response.status_code == 200
    assert response.content == b"x" * 1000
    assert response.truncated, "the server sent more than was read"


async def test_total_timeout_bounds_a_trickling_response(server: Running) -> None:
    target = await check_target(f"http://127.0.0.1:{server.port}/slow", DEV)
    started = time.monotonic()
    async with new_client(DEV) as client:
        with pytest.raises(httpx.TimeoutException):
            await send_pinned(client, target, content=b"", headers={}, timeout=TIMEOUT, total_timeout=0.3)
    assert time.monotonic() - started < 3


# -- https: SNI and certificate checks use the name, not the pinned address -----------------------


@dataclass
class Pki:
    ca_pem: Path
    cert: Path
    key: Path

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_pem))


def _make_pki(folder: Path, dns_name: str) -> Pki:
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "usp test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_name)]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(dns_name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(folder / "ca.pem", folder / "cert.pem", folder / "key.pem")
    pki.ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return pki


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, Pki]]:
    """An https server on 127.0.0.1 whose certificate names only ``hooks.example``."""
    pki = _make_pki(tmp_path_factory.mktemp("pki"), "hooks.example")
    for running in _run_server(Seen(), pki):
        yield running, pki


@pytest.fixture
async def tls_client(tls_server: tuple[Running, Pki]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(verify=tls_server[1].client_context(), trust_env=False) as client:
        yield client


async def test_https_verifies_the_certificate_against_the_name_not_the_ip(
    tls_server: tuple[Running, Pki], tls_client: httpx.AsyncClient
) -> None:
    running, _ = tls_server
    running.seen.requests.clear()
    resolver = _loopback_resolver("hooks.example")
    target = await check_target(f"https://hooks.example:{running.port}/in?x=1", DEV, resolver=resolver)
    response = await send_pinned(tls_client, target, content=b"{}", headers={}, timeout=TIMEOUT)
    assert response.status_code == 202
    [seen] = running.seen.requests
    assert seen["headers"]["host"] == f"hooks.example:{running.port}"
    assert seen["headers"]["connection"] == "close", "httpx's pool keys by ip:port: no keep-alive"
    assert (seen["raw_path"], seen["query_string"]) == (b"/in", b"x=1")


async def test_https_to_a_name_the_certificate_does_not_cover_fails(
    tls_server: tuple[Running, Pki], tls_client: httpx.AsyncClient
) -> None:
    running, _ = tls_server
    resolver = _loopback_resolver("other.example")
    target = await check_target(f"https://other.example:{running.port}/in", DEV, resolver=resolver)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await send_pinned(tls_client, target, content=b"{}", headers={}, timeout=TIMEOUT)


async def test_a_certificate_that_does_not_name_the_host_is_a_tls_error(
    tls_server: tuple[Running, Pki], tls_client: httpx.AsyncClient
) -> None:
    """What the console and the CLI show for the try: the TLS failure, not 'connect_error'."""
    running, _ = tls_server
    resolver = _loopback_resolver("other.example")
    target = await check_target(f"https://other.example:{running.port}/in", DEV, resolver=resolver)
    with pytest.raises(httpx.ConnectError) as caught:
        await send_pinned(tls_client, target, content=b"{}", headers={}, timeout=TIMEOUT)
    assert connect_failure(caught.value) == "tls_error"
    assert FAILURES["tls_error"] == "TLS failed (certificate or handshake)"


async def test_a_connection_verified_for_one_name_is_not_reused_for_another_on_the_same_address(
    tls_server: tuple[Running, Pki], tls_client: httpx.AsyncClient
) -> None:
    # httpx pools by ip:port; a kept-alive connection verified for hooks.example must not carry a
    # request for other.example (whose certificate was never checked).
    running, _ = tls_server
    resolver = _loopback_resolver("hooks.example", "other.example")
    good = await check_target(f"https://hooks.example:{running.port}/in", DEV, resolver=resolver)
    other = await check_target(f"https://other.example:{running.port}/in", DEV, resolver=resolver)
    assert (await send_pinned(tls_client, good, content=b"", headers={}, timeout=TIMEOUT)).status_code == 202
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await send_pinned(tls_client, other, content=b"", headers={}, timeout=TIMEOUT)


async def test_a_pinned_client_keeps_https_alive_per_name_and_never_across_names(
    tls_server: tuple[Running, Pki],
) -> None:
    # A PinnedClient pools by (scheme, ip, port, name): three requests to hooks.example share
    # one verified connection, and other.example on the same address gets its own handshake,
    # which fails (its certificate was never issued), instead of riding hooks.example's.
    running, pki = tls_server
    running.seen.requests.clear()
    resolver = _loopback_resolver("hooks.example", "other.example")
    good = await check_target(f"https://hooks.example:{running.port}/in", DEV, resolver=resolver)
    other = await check_target(f"https://other.example:{running.port}/in", DEV, resolver=resolver)
    transport = OriginTransport(ssl_context=pki.client_context())
    async with PinnedClient(timeout=TIMEOUT, transport=transport) as client:
        for _ in range(3):
            response = await send_pinned(client, good, content=b"{}", headers={}, timeout=TIMEOUT)
            assert response.status_code == 202
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await send_pinned(client, other, content=b"", headers={}, timeout=TIMEOUT)
        assert transport.idle_connections(("https", "127.0.0.1", running.port, "hooks.example")) == 1
    seen = running.seen.requests
    assert len(seen) == 3
    assert len({r["client_port"] for r in seen}) == 1, "one connection for the three"
    assert all("connection" not in r["headers"] for r in seen)
    assert {r["headers"]["host"] for r in seen} == {f"hooks.example:{running.port}"}


async def test_send_pinned_gets_with_no_body_and_reports_a_cut_body(server: Running) -> None:
    target = await check_target(f"http://127.0.0.1:{server.port}/big?x=1", DEV)
    async with new_client(DEV) as client:
        response = await send_pinned(
            client,
            target,
            method="get",
            headers={"Accept": "text/plain"},
            timeout=TIMEOUT,
            max_response_bytes=10,
        )
    assert (response.status_code, response.content, response.truncated) == (200, b"x" * 10, True)
    [seen] = server.seen.requests
    assert (seen["method"], seen["raw_path"], seen["query_string"], seen["body"]) == (
        "GET",
        b"/big",
        b"x=1",
        b"",
    )
    assert "content-length" not in seen["headers"]
    assert seen["headers"]["accept"] == "text/plain"
