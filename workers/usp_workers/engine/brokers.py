"""Broker destinations: a subscription whose target is a message broker of the business's own,
named by a URL of its scheme, instead of an https endpoint. The same engine delivers to it (the
outbox, the retries, the dead letter, replay and recover); only the last step differs, a publish
that the broker acknowledges instead of a POST that answers 2xx:

- ``amqp://user:pass@host:5672/vhost?exchange=X&routing_key=Y`` (RabbitMQ; ``amqps`` over TLS):
  a persistent message with publisher confirms, ``mandatory`` (an unroutable one is a failure),
  ``message_id`` the event id;
- ``nats://user:pass@host:4222?subject=S`` (NATS JetStream): a publish acknowledged by the stream,
  ``Nats-Msg-Id`` the event id, so JetStream deduplicates a retry;
- ``redis://:pass@host:6379/0?stream=S&maxlen=N`` (Redis Streams; ``rediss`` over TLS): ``XADD``
  capped at about ``maxlen`` entries (100,000 by default), the ``event_id`` field the event id.

Each message is the event JSON, signed in its headers by the message profile of
:mod:`usp_receiver.messages`. Brokers live on private networks: a broker target is allowed only
where private targets are (``USP_ALLOW_PRIVATE_TARGETS``) or by ``USP_PRIVATE_TARGET_ALLOWLIST``,
cloud metadata addresses never; connections go to the checked address. Credentials in the URL
are never shown or logged (:func:`usp_workers.operations.masked_url`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import parse_qs, unquote, urlsplit

import aio_pika
import nats
import redis.asyncio
from nats.js.api import PubAck

from usp_core.ssrf import (
    ResolvedTarget,
    Resolver,
    TargetPolicy,
    TargetRefused,
    default_resolver,
    metadata_class,
)
from usp_workers.engine.transport import TryResult

__all__ = ["SCHEMES", "BrokerURL", "check_broker", "is_broker_url", "parse_broker_url", "publish"]

logger = logging.getLogger("usp_workers")

SCHEMES: Final = {"amqp": 5672, "amqps": 5671, "nats": 4222, "redis": 6379, "rediss": 6380}
DEFAULT_MAXLEN: Final = 100_000
#: What a successful publish is recorded as: the broker took it (acknowledged, confirmed).
PUBLISHED: Final = 202


@dataclass(frozen=True, slots=True)
class BrokerURL:
    """A broker target, parsed."""

    scheme: str
    host: str
    port: int
    username: str | None
    password: str | None
    path: str  #: the AMQP virtual host, or the Redis database number
    params: Mapping[str, str]

    @property
    def kind(self) -> str:
        return {"amqps": "amqp", "rediss": "redis"}.get(self.scheme, self.scheme)


def is_broker_url(url: str) -> bool:
    """Whether ``url`` names a broker rather than an http(s) endpoint."""
    return url.split(":", 1)[0].lower() in SCHEMES


def parse_broker_url(url: str) -> BrokerURL:
    """``url`` parsed and checked: ``ValueError`` names what is missing or wrong."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise ValueError(f"a broker URL's scheme is one of {', '.join(SCHEMES)}")
    if not parts.hostname:
        raise ValueError("a broker URL names its host")
    try:
        port = parts.port or SCHEMES[scheme]
    except ValueError:
        raise ValueError("the broker URL's port is not a number from 1 to 65535") from None
    params = {name: values[-1] for name, values in parse_qs(parts.query, keep_blank_values=True).items()}
    broker = BrokerURL(
        scheme,
        parts.hostname,
        port,
        None if parts.username is None else unquote(parts.username),
        None if parts.password is None else unquote(parts.password),
        unquote(parts.path.lstrip("/")),
        params,
    )
    needed = {"amqp": ("exchange", "routing_key"), "nats": ("subject",), "redis": ("stream",)}[broker.kind]
    missing = [
        name for name in needed if not params.get(name) and not (name == "exchange" and "exchange" in params)
    ]
    if missing:
        raise ValueError(
            f"a {broker.kind} target names {' and '.join(needed)} in its query (missing {', '.join(missing)})"
        )
    if broker.kind == "redis":
        if broker.path and not broker.path.isdigit():
            raise ValueError("a redis target's path is its database number")
        maxlen = params.get("maxlen", str(DEFAULT_MAXLEN))
        if not maxlen.isdigit() or not 1 <= int(maxlen) <= 100_000_000:
            raise ValueError("maxlen is a whole number from 1 to 100,000,000")
    return broker


async def check_broker(
    url: str, settings: TargetPolicy, *, resolver: Resolver | None = None
) -> ResolvedTarget:
    """A broker target checked and pinned to an address, as webhook URLs are (:class:`TargetRefused`).
    Only where private targets are allowed, or on an allowlisted network; never a metadata address."""
    try:
        broker = parse_broker_url(url)
    except ValueError as exc:
        raise TargetRefused("bad_url", str(exc)) from None
    try:
        literal: Any = ipaddress.ip_address(broker.host)
    except ValueError:
        literal = None
    addresses = [str(literal)] if literal is not None else None
    if addresses is None:
        try:
            addresses = await (resolver or default_resolver)(broker.host, broker.port)
        except (OSError, UnicodeError):
            raise TargetRefused("unresolvable", f"{broker.host!r} does not resolve") from None
    if not addresses:
        raise TargetRefused("unresolvable", f"{broker.host!r} has no addresses")
    allowlist = [ipaddress.ip_network(cidr, strict=False) for cidr in settings.private_target_allowlist]
    for text in addresses:
        ip = ipaddress.ip_address(text)
        if metadata_class(ip) is not None:
            raise TargetRefused(
                "metadata_address", f"{broker.host!r} is a cloud metadata address, refused always"
            )
        if not settings.allow_private_targets and not any(ip in network for network in allowlist):
            raise TargetRefused(
                "private_address",
                "broker targets live on private networks: allow them with USP_ALLOW_PRIVATE_TARGETS=true"
                f" (or `usp-webhooks up --dev`), or list {broker.host!r}'s network in"
                " USP_PRIVATE_TARGET_ALLOWLIST",
            )
    return ResolvedTarget(
        url=url, scheme=broker.scheme, host=broker.host, port=broker.port, ip=str(addresses[0])
    )


# -- publishing --------------------------------------------------------------------------------

#: Open connections by (event loop, pinned address and credentials): a worker publishes every
#: delivery to a broker over one connection, opened again after a failure.
_CONNECTIONS: dict[tuple[int, str], Any] = {}


async def publish(
    target: ResolvedTarget,
    body: bytes,
    headers: Mapping[str, str],
    event_id: str,
    *,
    timeout: float,  # noqa: ASYNC109 - bounds the publish and its acknowledgement together
    now: Callable[[], datetime],
) -> TryResult:
    """Publish one message and wait for the broker's acknowledgement; what happened, as a try's
    result (:data:`PUBLISHED` when the broker took it). Never raises (but lets cancellation through)."""
    broker = parse_broker_url(target.url)
    started_at = now()
    clock = time.perf_counter()
    key = (
        id(asyncio.get_running_loop()),
        f"{broker.kind}|{target.ip}|{broker.port}|{broker.username}|{broker.password}|{broker.path}",
    )
    try:
        async with asyncio.timeout(timeout):
            detail = await _PUBLISHERS[broker.kind](key, broker, target.ip, body, headers, event_id)
    except TimeoutError:
        _forget(key)
        return TryResult(
            started_at, _ms(clock), error_class="timeout", error=f"no acknowledgement within {timeout} s"
        )
    except Exception as exc:  # the broker's client raises its own kinds: a failed publish, retried
        _forget(key)
        return TryResult(
            started_at,
            _ms(clock),
            error_class="publish_failed",
            error=f"{type(exc).__name__}: {str(exc)[:300]}",
        )
    return TryResult(started_at, _ms(clock), status_code=PUBLISHED, response_excerpt=detail)


def _ms(clock: float) -> float:
    return (time.perf_counter() - clock) * 1000


def _forget(key: tuple[int, str]) -> None:
    connection = _CONNECTIONS.pop(key, None)
    if connection is not None:
        asyncio.get_running_loop().create_task(_close(connection))


async def _close(connection: Any) -> None:
    try:
        if isinstance(connection, tuple):
            connection = connection[0]
        close = getattr(connection, "aclose", None) or connection.close
        result = close()
        if asyncio.iscoroutine(result):
            await result
    except Exception:  # closing a broken connection: nothing more to do
        logger.debug("closing a broker connection failed", exc_info=True)


async def _amqp(
    key: tuple[int, str], broker: BrokerURL, ip: str, body: bytes, headers: Mapping[str, str], event_id: str
) -> str:
    held = _CONNECTIONS.get(key)
    if held is None:
        connection = await aio_pika.connect(
            host=ip,
            port=broker.port,
            login=broker.username or "guest",
            password=broker.password or "guest",
            virtualhost=broker.path or "/",
            ssl=broker.scheme == "amqps",
        )
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchanges: dict[str, Any] = {}
        held = _CONNECTIONS[key] = (connection, channel, exchanges)
    connection, channel, exchanges = held
    name = broker.params.get("exchange", "")
    exchange = exchanges.get(name)
    if exchange is None:
        exchange = channel.default_exchange if not name else await channel.get_exchange(name, ensure=True)
        exchanges[name] = exchange
    message = aio_pika.Message(
        body,
        content_type="application/json",
        message_id=event_id,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        headers=dict(headers),
    )
    await exchange.publish(message, routing_key=broker.params["routing_key"], mandatory=True)
    return f"confirmed by {broker.kind} exchange {name or '(default)'!r}"


async def _nats(
    key: tuple[int, str], broker: BrokerURL, ip: str, body: bytes, headers: Mapping[str, str], event_id: str
) -> str:
    held = _CONNECTIONS.get(key)
    if held is None:
        client = await nats.connect(
            servers=[f"nats://{ip}:{broker.port}"],
            user=broker.username,
            password=broker.password,
            connect_timeout=5,
            max_reconnect_attempts=0,
            allow_reconnect=False,
        )
        held = _CONNECTIONS[key] = (client, client.jetstream())
    _, stream = held
    ack: PubAck = await stream.publish(
        broker.params["subject"], body, headers=dict(headers) | {"Nats-Msg-Id": event_id}
    )
    duplicate = " (a duplicate: the stream had it)" if ack.duplicate else ""
    return f"acknowledged by stream {ack.stream!r} at {ack.seq}{duplicate}"


async def _redis(
    key: tuple[int, str], broker: BrokerURL, ip: str, body: bytes, headers: Mapping[str, str], event_id: str
) -> str:
    client = _CONNECTIONS.get(key)
    if client is None:
        client = _CONNECTIONS[key] = redis.asyncio.Redis(
            host=ip,
            port=broker.port,
            db=int(broker.path or 0),
            username=broker.username or None,
            password=broker.password or None,
            ssl=broker.scheme == "rediss",
            socket_connect_timeout=5,
        )
    fields: dict[Any, Any] = {"event_id": event_id, "body": body}
    fields.update({name.lower(): value for name, value in headers.items()})
    maxlen = int(broker.params.get("maxlen", DEFAULT_MAXLEN))
    entry = await client.xadd(broker.params["stream"], fields, maxlen=maxlen, approximate=True)
    shown = entry.decode() if isinstance(entry, bytes) else entry
    return f"added to stream {broker.params['stream']!r} as {shown}"


_PUBLISHERS: Final = {"amqp": _amqp, "nats": _nats, "redis": _redis}
