"""Server-side request forgery guard for webhook targets: which URLs may be delivered to, checked at
registration and again at delivery, and :func:`send_pinned`, which connects to the address that
was checked (the rules: docs/architecture.md, "Outbound requests").
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, Literal, Protocol

import anyio
import httpx

from usp_core.origin_pool import Origin, PinnedClient, RawRequest

__all__ = [
    "METADATA_HOSTS",
    "IPAddress",
    "PinnedResponse",
    "RefusalReason",
    "ResolvedTarget",
    "Resolver",
    "SyncResolver",
    "TargetPolicy",
    "TargetRefused",
    "address_allowed",
    "address_class",
    "check_target",
    "check_target_sync",
    "default_resolver",
    "default_sync_resolver",
    "metadata_class",
    "new_client",
    "send_pinned",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: ``(host, port) -> IP address strings``. Injectable so tests (which have no DNS) can make a name
#: resolve to ``127.0.0.1`` honestly, and so deployments can plug in their own resolver.
Resolver = Callable[[str, int], Awaitable[list[str]]]
#: The same for :func:`check_target_sync`.
SyncResolver = Callable[[str, int], list[str]]

RefusalReason = Literal[
    "bad_url",
    "bad_scheme",
    "no_host",
    "bad_host",
    "credentials_in_url",
    "bad_port",
    "unresolvable",
    "private_address",
    "metadata_address",
]

_SCHEMES: Final = {"http": 80, "https": 443}
# After httpx's IDNA step a host is ASCII; anything beyond letters, digits, hyphen, underscore and
# dots (percent signs, spaces, ...) is not a name a resolver should be asked about.
_HOSTNAME_RE: Final = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")
_DEFAULT_RESOLVE_TIMEOUT: Final = 5.0


class TargetPolicy(Protocol):
    """The settings this module reads (``usp_workers.settings.CommonSettings`` satisfies it)."""

    @property
    def allow_private_targets(self) -> bool: ...

    @property
    def private_target_allowlist(self) -> Sequence[str]: ...

    @property
    def connect_timeout(self) -> float: ...


class TargetRefused(ValueError):
    """A webhook target the SSRF policy refuses.

    ``reason`` is a stable code for APIs and logs; the message names the problem and, for refused
    addresses, the address class (never the path, query or credentials, which may hold secrets).
    """

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(message)
        self.reason: RefusalReason = reason


@dataclass(frozen=True, slots=True)
class ResolvedTarget:
    """A target that passed the check, with the address the delivery must connect to.

    ``url`` is the URL exactly as given (what the signature's ``@authority``/``@path`` cover);
    ``host`` is the ASCII (IDNA) host without brackets; ``port`` is explicit (default filled in);
    ``ip`` is the checked address in canonical text (an IPv4-mapped address is given as its IPv4).
    """

    url: str
    scheme: str
    host: str
    port: int
    ip: str

    @property
    def authority(self) -> str:
        """The ``Host`` header: RFC 9421's ``@authority`` of the URL (lower case, IPv6 in brackets,
        default port omitted), so the receiver derives the value the caller signed."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == _SCHEMES[self.scheme] else f"{host}:{self.port}"


# --------------------------------------------------------------------------------------------
# Address classes
# --------------------------------------------------------------------------------------------

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Order matters where ranges nest: the first match names the class.
_V4_CLASSES: Final[tuple[tuple[ipaddress.IPv4Network, str], ...]] = (
    (_V4("0.0.0.0/8"), "unspecified ('this network')"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared (CGNAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local (cloud metadata)"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignment"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("240.0.0.0/4"), "reserved"),
)

_V6_UNSPECIFIED: Final = _V6("::/128")
_V6_LOOPBACK: Final = _V6("::1/128")
_V6_COMPATIBLE: Final = _V6("::/96")  # deprecated IPv4-compatible ::a.b.c.d
_V6_NAT64: Final = _V6("64:ff9b::/96")  # RFC 6052 well-known prefix: last 32 bits are IPv4
_V6_6TO4: Final = _V6("2002::/16")  # bits 16..47 are IPv4
_V6_TEREDO: Final = _V6("2001::/32")
_V6_GLOBAL_UNICAST: Final = _V6("2000::/3")
_V6_CLASSES: Final[tuple[tuple[ipaddress.IPv6Network, str], ...]] = (
    (_V6("64:ff9b:1::/48"), "local-use NAT64"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("2001::/23"), "IETF protocol assignment"),
    (_V6("3fff::/20"), "documentation"),
    (_V6("5f00::/16"), "SRv6 segment identifier"),
    (_V6("fc00::/7"), "unique-local (ULA)"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
)


def _ipv4_class(ip: ipaddress.IPv4Address) -> str | None:
    for network, name in _V4_CLASSES:
        if ip in network:
            return name
    # Belt and braces: whatever Python's registry knows that the table above does not.
    return None if ip.is_global else "reserved"


def address_class(ip: IPAddress) -> str | None:
    """Name the non-global class ``ip`` belongs to, or ``None`` for a global unicast address.

    Python's ``is_global`` alone is not enough: it calls IPv4 multicast global, and it does not
    look inside IPv6 forms that carry an IPv4 address, where ``64:ff9b::7f00:1`` (NAT64) and
    ``2002:7f00:1::`` (6to4) both mean ``127.0.0.1``. So the embedded address is checked explicitly.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        return _ipv4_class(ip)
    if ip.scope_id:
        return "scoped (zone index)"
    if ip.ipv4_mapped is not None:
        inner = _ipv4_class(ip.ipv4_mapped)
        return None if inner is None else f"{inner} (IPv4-mapped)"
    if ip in _V6_UNSPECIFIED:
        return "unspecified"
    if ip in _V6_LOOPBACK:
        return "loopback"
    if ip in _V6_COMPATIBLE:
        inner = _ipv4_class(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        return "IPv4-compatible (deprecated)" if inner is None else f"{inner} (IPv4-compatible)"
    if ip in _V6_NAT64:
        return _embedded("NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip in _V6_TEREDO:
        # A tunnel endpoint is never a webhook server; refusing it whole also covers both the
        # server and the (obfuscated) client IPv4 address it embeds.
        return "Teredo tunnel"
    if ip.sixtofour is not None:
        inner = _embedded("6to4", ip.sixtofour)
        if inner is not None:
            return inner
    for network, name in _V6_CLASSES:
        if ip in network:
            return name
    if ip not in _V6_GLOBAL_UNICAST:
        return "reserved"
    return None if ip.is_global else "reserved"


#: Cloud metadata services and link-local ranges: refused always, whatever opens private targets
#: (a development machine in a cloud VM still has its instance credentials one request away).
_ALWAYS_V4: Final[tuple[tuple[ipaddress.IPv4Network, str], ...]] = (
    (_V4("169.254.0.0/16"), "link-local (cloud metadata)"),
    (_V4("168.63.129.16/32"), "cloud metadata (Azure wire server)"),
    (_V4("100.100.100.200/32"), "cloud metadata (Alibaba)"),
)
_ALWAYS_V6: Final[tuple[tuple[ipaddress.IPv6Network, str], ...]] = (
    (_V6("fe80::/10"), "link-local"),
    (_V6("fd00:ec2::254/128"), "cloud metadata (AWS IPv6)"),
)
#: Names of metadata services (refused before any lookup; ends of names, lowercase).
METADATA_HOSTS: Final = frozenset(
    {"metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"}
)


def metadata_class(ip: IPAddress) -> str | None:
    """The always-refused class of ``ip`` (cloud metadata, link-local), looking inside every IPv6
    form that carries an IPv4 address; ``None`` for anything else.

    >>> metadata_class(ipaddress.ip_address("::ffff:169.254.169.254"))
    'link-local (cloud metadata)'
    >>> metadata_class(ipaddress.ip_address("64:ff9b::a9fe:a9fe"))
    'link-local (cloud metadata)'
    >>> metadata_class(ipaddress.ip_address("127.0.0.1")) is None
    True
    """
    candidates: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "scoped (zone index)"
        for inner in (ip.ipv4_mapped, ip.sixtofour):
            if inner is not None:
                candidates.append(inner)
        if ip in _V6_COMPATIBLE or ip in _V6_NAT64:
            candidates.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        if ip.teredo is not None:
            candidates.extend(ip.teredo)
    for candidate in candidates:
        table = _ALWAYS_V4 if isinstance(candidate, ipaddress.IPv4Address) else _ALWAYS_V6
        for network, name in table:
            if candidate in network:
                return name
    return None


def _embedded(form: str, inner: ipaddress.IPv4Address) -> str | None:
    name = _ipv4_class(inner)
    return None if name is None else f"{name} (embedded in {form})"


@lru_cache(maxsize=32)
def _networks(cidrs: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(cidr, strict=False) for cidr in cidrs)


def _canonical(ip: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address *is* its IPv4 address at the socket level: use the IPv4."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None and not ip.scope_id:
        return ip.ipv4_mapped
    return ip


def address_allowed(ip: IPAddress, settings: TargetPolicy) -> bool:
    """Whether a delivery may connect to ``ip``: global unicast only, unless opened by settings.

    ``allow_private_targets`` opens loopback and private ranges (development); an allowlisted
    CIDR opens just that range (e.g. ``127.0.0.0/8`` for a local test receiver). Neither opens
    cloud metadata or link-local addresses (:func:`metadata_class`). An IPv4-mapped address is
    matched as its IPv4 address, since that is where the connection goes.
    """
    if metadata_class(ip) is not None:
        return False
    if settings.allow_private_targets:
        return True
    ip = _canonical(ip)
    if any(ip in network for network in _networks(tuple(settings.private_target_allowlist))):
        return True
    return address_class(ip) is None


# --------------------------------------------------------------------------------------------
# URL parsing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Parsed:
    url: str
    scheme: str
    host: str
    port: int
    literal: IPAddress | None


def _parse(url: str) -> _Parsed:
    """Everything that can be decided without DNS."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise TargetRefused("bad_url", f"not a valid URL: {type(exc).__name__}") from None
    scheme = parsed.scheme
    if scheme not in _SCHEMES:
        raise TargetRefused("bad_scheme", f"scheme {scheme!r} is not allowed (only http and https)")
    if parsed.userinfo:
        raise TargetRefused("credentials_in_url", "credentials in the URL are not allowed")
    host = parsed.raw_host.decode("ascii", errors="replace")
    if not host:
        raise TargetRefused("no_host", "the URL has no host")
    if host.lower().rstrip(".") in METADATA_HOSTS:
        raise TargetRefused("metadata_address", f"{host!r} is a cloud metadata service, refused always")
    port = parsed.port if parsed.port is not None else _SCHEMES[scheme]
    if not 1 <= port <= 65535:
        raise TargetRefused("bad_port", f"port {port} is outside 1..65535")
    return _Parsed(url=url, scheme=scheme, host=host, port=port, literal=_literal_address(host))


def _literal_address(host: str) -> IPAddress | None:
    """The address a host spells literally, or ``None`` for a name that needs DNS."""
    if ":" in host:  # httpx has removed the brackets of an IPv6 literal
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            raise TargetRefused("bad_host", "malformed IPv6 address") from None
        if address.scope_id:  # a zone names one of *our* interfaces: meaningless in a webhook URL
            raise TargetRefused("bad_host", "an IPv6 zone index is not allowed")
        return address
    if not _HOSTNAME_RE.fullmatch(host):
        raise TargetRefused("bad_host", "the host contains characters a hostname cannot have")
    return _whatwg_ipv4(host)


_NUMBER_RE: Final = re.compile(r"[0-9]+|0x[0-9a-f]*")


def _whatwg_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """Read ``host`` as an IPv4 address the way browsers and ``inet_aton`` do (WHATWG URL §3.5).

    A host whose last label is a number is an IPv4 address, in any of the legacy spellings:
    ``2130706433``, ``0x7f.1``, ``017700000001``, ``127.1``, ``127.0.0.1.``. If we called such a
    host a name, the system resolver would still turn it into ``127.0.0.1``, so it is parsed here
    and refused if it does not denote exactly one address.
    """
    labels = host.split(".")
    if len(labels) > 1 and labels[-1] == "":
        labels.pop()
    if not _NUMBER_RE.fullmatch(labels[-1]):
        return None  # a domain name
    if len(labels) > 4:
        raise TargetRefused("bad_host", "the host ends in a number but is not an IPv4 address")
    numbers: list[int] = []
    for label in labels:
        number = _whatwg_number(label)
        if number is None:
            raise TargetRefused("bad_host", "the host ends in a number but is not an IPv4 address")
        numbers.append(number)
    *leading, last = numbers
    if any(n > 255 for n in leading) or last >= 256 ** (5 - len(numbers)):
        raise TargetRefused("bad_host", "the host ends in a number but is not an IPv4 address")
    value = last + sum(n * 256 ** (3 - i) for i, n in enumerate(leading))
    return ipaddress.IPv4Address(value)


def _whatwg_number(label: str) -> int | None:
    try:
        if label.startswith("0x"):
            return int(label[2:], 16) if label[2:] else 0
        if len(label) > 1 and label.startswith("0"):
            return int(label[1:], 8)
        return int(label, 10) if label.isdigit() else None
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# Resolution and the check
# --------------------------------------------------------------------------------------------


async def default_resolver(host: str, port: int) -> list[str]:
    """Resolve with the system resolver (``anyio.getaddrinfo``, run off the event loop)."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def default_sync_resolver(host: str, port: int) -> list[str]:
    """Resolve with the system resolver, blocking (for :func:`check_target_sync`)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _decide(parsed: _Parsed, addresses: Iterable[str], settings: TargetPolicy) -> ResolvedTarget:
    """Every address must be allowed; the first one is the one the delivery connects to."""
    checked: list[IPAddress] = []
    for text in addresses:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise TargetRefused("unresolvable", f"{parsed.host!r} resolved to a non-address") from None
        metadata = metadata_class(ip)
        if metadata is not None:
            where = "is" if parsed.literal is not None else "resolves to"
            raise TargetRefused(
                "metadata_address", f"{parsed.host!r} {where} a {metadata} address, refused always"
            )
        if not address_allowed(ip, settings):
            what = address_class(ip) or "not allowlisted"
            where = "is" if parsed.literal is not None else "resolves to"
            raise TargetRefused(
                "private_address",
                f"{parsed.host!r} {where} a non-global address: {what}; on a development machine, allow "
                "such targets with USP_ALLOW_PRIVATE_TARGETS=true (or run `usp-webhooks up --dev`), in "
                "production list the network in USP_PRIVATE_TARGET_ALLOWLIST",
            )
        checked.append(_canonical(ip))
    if not checked:
        raise TargetRefused("unresolvable", f"{parsed.host!r} has no addresses")
    return ResolvedTarget(
        url=parsed.url, scheme=parsed.scheme, host=parsed.host, port=parsed.port, ip=str(checked[0])
    )


async def check_target(
    url: str, settings: TargetPolicy, *, resolver: Resolver | None = None
) -> ResolvedTarget:
    """Check a webhook URL (at registration and before every delivery) and pin its address.

    Raises :class:`TargetRefused`. Literal IP hosts are not resolved. Resolution is bounded by
    ``settings.connect_timeout``: a resolver that hangs refuses the target as ``unresolvable``.
    """
    parsed = _parse(url)
    if parsed.literal is not None:
        return _decide(parsed, [str(parsed.literal)], settings)
    resolve = resolver or default_resolver
    try:
        with anyio.fail_after(_resolve_timeout(settings)):
            addresses = await resolve(parsed.host, parsed.port)
    except (OSError, TimeoutError, UnicodeError):
        raise TargetRefused("unresolvable", f"{parsed.host!r} does not resolve") from None
    return _decide(parsed, addresses, settings)


def check_target_sync(
    url: str, settings: TargetPolicy, *, resolver: SyncResolver | None = None
) -> ResolvedTarget:
    """:func:`check_target` for synchronous callers (e.g. a Celery task or a sync endpoint).

    It uses a plain blocking resolver rather than ``anyio.run`` so it also works from a thread
    whose event loop is running elsewhere. The system resolver's own timeout applies (``socket``
    offers no per-call one); inject a resolver to bound it differently.
    """
    parsed = _parse(url)
    if parsed.literal is not None:
        return _decide(parsed, [str(parsed.literal)], settings)
    resolve = resolver or default_sync_resolver
    try:
        addresses = resolve(parsed.host, parsed.port)
    except (OSError, UnicodeError):
        raise TargetRefused("unresolvable", f"{parsed.host!r} does not resolve") from None
    return _decide(parsed, addresses, settings)


def _resolve_timeout(settings: TargetPolicy) -> float:
    return float(getattr(settings, "connect_timeout", _DEFAULT_RESOLVE_TIMEOUT))


# --------------------------------------------------------------------------------------------
# Delivery
# --------------------------------------------------------------------------------------------

#: Response bytes kept by :func:`send_pinned`: enough for an error message, not a memory bomb.
DEFAULT_MAX_RESPONSE_BYTES: Final = 64 * 1024
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_BODYLESS_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})
#: Headers ``send_pinned`` sets itself (framing, connection, the pinned authority).
_TRANSPORT_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})


@dataclass(frozen=True, slots=True)
class PinnedResponse:
    """What :func:`send_pinned` got back: complete, the connection already released.

    ``content`` is the body as sent (not decoded: a capped read of a compressed body means
    nothing) and at most ``max_response_bytes`` long; ``truncated`` says the server sent more, which
    was not read. ``headers`` are the response's headers as received; ``target`` is where the
    request went (:attr:`pinned_url`).
    """

    status_code: int
    headers: httpx.Headers
    content: bytes
    truncated: bool
    target: ResolvedTarget

    @property
    def is_redirect(self) -> bool:
        """A redirect status with a ``Location`` (as httpx defines it). Never followed."""
        return self.status_code in _REDIRECT_STATUSES and "location" in self.headers

    @property
    def pinned_url(self) -> httpx.URL:
        """The URL the request was sent to: the checked address in place of the name."""
        return httpx.URL(self.target.url).copy_with(host=self.target.ip, port=self.target.port)


def new_client(settings: TargetPolicy) -> PinnedClient:
    """A client fit for :func:`send_pinned`: no proxies from the environment, no redirects, and
    connections pooled per origin including the https name (see :class:`PinnedClient`)."""
    timeout = _resolve_timeout(settings)
    return PinnedClient(timeout=httpx.Timeout(timeout * 3, connect=timeout))


async def send_pinned(
    client: httpx.AsyncClient,
    target: ResolvedTarget,
    *,
    method: str = "POST",
    content: bytes = b"",
    headers: Mapping[str, str],
    timeout: httpx.Timeout,  # noqa: ASYNC109 - httpx's per-operation timeouts; total_timeout bounds all
    keep_alive: bool | None = None,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    total_timeout: float | None = None,
) -> PinnedResponse:
    """Send ``method`` with ``content`` to the checked address of ``target``, never to a fresh
    DNS answer: the one way the workers (deliveries) and the API (profile fetches) reach a URL
    someone else chose.

    The request URL carries the IP literal (so httpx cannot resolve the name again: no DNS
    rebinding between check and connect) with the original path and query byte for byte; the
    ``Host`` header is the original authority and, for https, the ``sni_hostname`` extension makes
    the connection send the original name in SNI *and* verify the certificate against it.
    Together the receiver sees exactly the ``@authority`` and ``@path`` the caller signed.

    Redirects are never followed: a 3xx comes back as it is.

    ``keep_alive``: for https, a kept-alive connection verified for one name must never carry a
    request for another name on the same address (a CDN serves many), or that name's certificate
    check is skipped. A :class:`PinnedClient` pools by name, so through it connections are kept
    alive (``None``, the default, decides by the client); httpx's own pool keys by
    ``scheme://ip:port`` only, so through any other client https requests send
    ``Connection: close``. ``True`` forces keep-alive (only for a client that talks to this one
    host), ``False`` forces ``Connection: close``. Plain http is kept alive unless ``False``.

    The body is read raw and at most ``max_response_bytes`` of it (then the connection is
    closed, not drained). ``total_timeout`` bounds the whole exchange (httpx's timeouts are per
    operation, so a server dribbling a byte a second would otherwise hold it forever), raising
    ``httpx.TimeoutException``.
    """
    method = method.upper()
    if keep_alive is None:
        keep_alive = isinstance(client, PinnedClient) or target.scheme == "http"
    try:
        if isinstance(client, PinnedClient):  # its pool keeps the deadline: no timer around the call
            deadline = None
            if total_timeout is not None:  # phases that cannot outlast the whole need no timer
                deadline = asyncio.get_running_loop().time() + total_timeout
                timeout = httpx.Timeout(
                    connect=_within(timeout.connect, total_timeout),
                    read=_within(timeout.read, total_timeout),
                    write=_within(timeout.write, total_timeout),
                    pool=None,
                )
            return await _send_direct(
                client, target, method, content, headers, timeout, keep_alive, max_response_bytes, deadline
            )
        async with asyncio.timeout(total_timeout):
            return await _send_httpx(
                client, target, method, content, headers, timeout, keep_alive, max_response_bytes
            )
    except TimeoutError:
        raise httpx.TimeoutException(f"the exchange took longer than {total_timeout} s") from None


async def _send_direct(
    client: PinnedClient,
    target: ResolvedTarget,
    method: str,
    content: bytes,
    headers: Mapping[str, str],
    timeout: httpx.Timeout,  # noqa: ASYNC109 - per operation; send_pinned bounds the whole
    keep_alive: bool,
    limit: int,
    deadline: float | None,
) -> PinnedResponse:
    """Through the client's :class:`~usp_core.origin_pool.OriginTransport` directly, without
    httpx's request and response models (a third of a delivery's CPU in profiles)."""
    wire: list[tuple[bytes, bytes]] = [(b"Host", target.authority.encode("ascii"))]
    for name, value in headers.items():
        if name.lower() not in _TRANSPORT_HEADERS:
            wire.append((name.encode("ascii"), value.encode("latin-1")))
    if content or method not in _BODYLESS_METHODS:
        wire.append((b"Content-Length", str(len(content)).encode("ascii")))
    if not keep_alive:
        wire.append((b"Connection", b"close"))
    sni = target.host if target.scheme == "https" else None
    origin: Origin = (target.scheme, target.ip, target.port, sni)
    raw = RawRequest(
        method=method.encode("ascii"),
        target=_raw_path(target.url),
        headers=wire,
        body=content,
        connect_timeout=timeout.connect,
        read_timeout=timeout.read,
        write_timeout=timeout.write,
        deadline=deadline,
    )
    got = await client.origin_transport.request(origin, raw, max_body=limit)
    return PinnedResponse(got.status_code, httpx.Headers(got.headers), got.content, got.truncated, target)


async def _send_httpx(
    client: httpx.AsyncClient,
    target: ResolvedTarget,
    method: str,
    content: bytes,
    headers: Mapping[str, str],
    timeout: httpx.Timeout,  # noqa: ASYNC109 - per operation; send_pinned bounds the whole
    keep_alive: bool,
    limit: int,
) -> PinnedResponse:
    """Through any other httpx client: the pinned URL, ``Host`` and the SNI extension."""
    original = httpx.URL(target.url)
    request_headers = httpx.Headers(headers)
    request_headers["Host"] = target.authority
    if not keep_alive:
        request_headers["Connection"] = "close"
    request = client.build_request(
        method,
        original.copy_with(host=target.ip, port=target.port),
        content=content if content or method not in _BODYLESS_METHODS else None,
        headers=request_headers,
        timeout=timeout,
        extensions={"sni_hostname": target.host} if target.scheme == "https" else {},
    )
    # httpx rebuilds the URL from its components; make sure nothing was re-encoded on the way,
    # or the receiver would verify a different @path than the one that was signed.
    if request.url.raw_path != original.raw_path:  # pragma: no cover - guards an httpx change
        raise RuntimeError("pinned request changed the path or query")
    response = await client.send(request, stream=True, follow_redirects=False)
    truncated = False
    try:
        body = bytearray()
        async for chunk in response.aiter_raw():
            if len(body) + len(chunk) > limit:
                body += chunk[: limit - len(body)]
                truncated = True
                break
            body += chunk
    finally:
        await response.aclose()
    return PinnedResponse(response.status_code, response.headers, bytes(body), truncated, target)


def _within(phase: float | None, total: float) -> float | None:
    """A phase's own timeout, or ``None`` when the total ends first anyway."""
    return None if phase is None or phase >= total else phase


@lru_cache(maxsize=4096)
def _raw_path(url: str) -> bytes:
    """The path and query of ``url`` byte for byte, as signed (``@path``) and sent."""
    return httpx.URL(url).raw_path
