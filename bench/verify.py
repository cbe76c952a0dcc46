"""How fast a platform can verify USP webhooks, against the floor and the alternatives.

Run: ``uv run python bench/verify.py [--seconds 2] [--rounds 3] [--in-flight 8,32] [--redis-url redis://…/15]``

All rows run in one process pinned to one core, on the same ~1 KB signed ``booking.confirmed``
body:

* raw Ed25519 verify with ``cryptography`` — the floor no verifier can beat;
* ``http-message-signatures`` as-is (its verifier, digest checked via ``body=``);
* ours: digest + signature + policy (``Verifier.verify``), then the same plus reading the
  ``event_id`` and a dedupe claim+commit in memory and in Redis (a fresh id every iteration, so
  every claim is NEW — the expensive case);
* the in-band JWS a notification on a live MCP session carries (JCS of the same event);
* the ``standardwebhooks`` package verifying an HMAC signature of the same body, and ours
  (``usp_receiver.standard_webhooks``) verifying ``v1`` and ``v1a`` and signing both as a worker
  does for a subscription that asks for them; beside the raw Ed25519 sign rate of the run;
* ``process_once`` with memory and Redis dedupe on one event loop, ``--in-flight`` deliveries at a
  time (8 and 32 by default), as an ASGI receiver serves them;
* a second table, the Node.js receiver (``receiver-js/bench/verify.mjs``, on the same core and the
  same delivery): raw Ed25519 verify and sign in ``node:crypto`` (its floor and the guide's
  reference), ``Verifier.verify``, with memory dedupe, the whole ``WebhookReceiver.receive`` and a
  Standard Webhooks ``v1`` verify. ``--no-node`` leaves it out; it needs ``receiver-js`` built
  (``npm ci && npm run build`` there).

The rows run in turn, ``--rounds`` times (3 by default), and each row's best round is printed,
the floor's included: this machine's speed drifts by a third within minutes (a VM's neighbours),
and a row measured in a slow stretch would read as a slower path.

The sequential Redis row waits for one round trip per event: where that round trip is as long as
a verification it cannot reach half of the floor. The row "Redis round trip alone" measures one
(a ``PING`` on a raw socket, no client library), so the sequential row's ceiling is 1 / (ours +
that round trip). The async rows overlap one event's round trip with the next one's verification.
Their event ids come from a counter, as the sequential rows' do.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import itertools
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ed25519
from http_message_signatures import HTTPMessageVerifier, MappingKeyResolver, algorithms
from rich.console import Console
from rich.table import Table
from standardwebhooks import Webhook

from usp_receiver import (
    JWKS,
    SigningKey,
    Verifier,
    sign_notification_params,
    sign_request,
    standard_webhooks,
    verify_notification_params,
)
from usp_receiver.dedupe import DedupeStore, MemoryDedupe, Processed, process_once
from usp_receiver.dedupe.redis import RedisDedupe
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE

URL = "https://platform.example/webhooks/usp"


def rate(operation: Callable[[int], object], seconds: float) -> float:
    """Operations per second over at least ``seconds`` (after a short warm-up)."""
    for i in range(200):
        operation(i)
    done = 0
    start = time.perf_counter()
    elapsed = 0.0
    while elapsed < seconds:
        for _ in range(500):
            operation(done)
            done += 1
        elapsed = time.perf_counter() - start
    return done / elapsed


def ping(url: str) -> Callable[[int], object]:
    """One loopback round trip to Redis and nothing else (no client library): what a sequential
    dedupe claim waits for at least."""
    parts = urllib.parse.urlsplit(url)
    connection = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def operation(i: int) -> object:
        connection.sendall(b"*1\r\n$4\r\nPING\r\n")
        return connection.recv(64)

    return operation


def concurrent_rate(store: DedupeStore, step: Callable[[], str], seconds: float, in_flight: int) -> float:
    """Events per second through ``process_once`` with ``in_flight`` deliveries at a time on one
    event loop, as an ASGI receiver serves them: one event's Redis round trip overlaps the next
    one's verification."""

    async def run() -> float:
        async def noop() -> None:
            return None

        async def one_delivery() -> None:
            if await process_once(store, step(), noop) is not Processed.ACCEPTED:
                raise RuntimeError("a fresh event id was not accepted")

        async def caller(deadline: float, counts: list[int]) -> None:
            while time.perf_counter() < deadline:
                await one_delivery()
                counts[0] += 1

        await asyncio.gather(*(one_delivery() for _ in range(200)))
        counts = [0]
        start = time.perf_counter()
        await asyncio.gather(*(caller(start + seconds, counts) for _ in range(in_flight)))
        rate = counts[0] / (time.perf_counter() - start)
        if isinstance(store, RedisDedupe):
            await store.aclose()
        return rate

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per row")
    parser.add_argument(
        "--in-flight",
        default="8,32",
        help="comma-separated deliveries at a time in the async rows (a receiver under load has many)",
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("USP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")
    )
    parser.add_argument("--rounds", type=int, default=3, help="times every row runs; its best counts")
    parser.add_argument("--no-node", action="store_true", help="leave out the Node.js receiver's table")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

    event = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event["timestamp"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    # A realistic booking carries free text; pad to the ~1 KB a typical webhook weighs.
    event["data"]["notes"] = "Customer asked for a window seat and a quiet room. " * 9
    body = json.dumps(event).encode()
    key = SigningKey.generate()
    headers = {"Content-Type": "application/json"}
    headers |= sign_request("POST", URL, headers, body, [key])
    now = time.time()

    raw_key: ed25519.Ed25519PublicKey = key.public.key  # type: ignore[assignment]
    raw_signature = key.sign(b"x" * 300)
    verifier_keys = JWKS([key.public])
    verifier = Verifier(verifier_keys)

    library = HTTPMessageVerifier(
        signature_algorithm=algorithms.ED25519,
        key_resolver=MappingKeyResolver(public_keys={key.kid: raw_key}, private_keys={}),
    )

    class _Message:
        method = "POST"
        url = URL

        def __init__(self) -> None:
            self.headers = dict(headers)

    library_message = _Message()

    def fresh_redis() -> RedisDedupe:
        return RedisDedupe(url=args.redis_url, prefix="usp:bench:", ttl=60)

    def with_dedupe(store: DedupeStore) -> Callable[[int], object]:
        run = uuid.uuid4().hex[:8]

        def operation(i: int) -> object:
            verifier.verify("POST", URL, headers, body, now=now)
            event_id = json.loads(body)["event_id"]
            claim = store.claim(f"{event_id}-{run}-{i}")
            store.commit(claim)
            return claim

        return operation

    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    hooks = Webhook(secret)
    msg_id = "msg_" + uuid.uuid4().hex
    stamp = datetime.datetime.now(datetime.UTC)
    std_headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": hooks.sign(msg_id, stamp, body.decode()),
    }

    raw_private = ed25519.Ed25519PrivateKey.generate()
    ours_secret, ours_key = standard_webhooks.new_secret(), standard_webhooks.new_signing_key()
    ours_public = standard_webhooks.public_key_of(ours_key)
    sent_at = int(stamp.timestamp())
    v1 = standard_webhooks.sign(msg_id, sent_at, body, secrets=[ours_secret])
    v1a = standard_webhooks.sign(msg_id, sent_at, body, signing_keys=[ours_key])

    rows: list[tuple[str, Callable[[int], object]]] = [
        ("raw Ed25519 verify (cryptography) — floor", lambda i: raw_key.verify(raw_signature, b"x" * 300)),
        ("raw Ed25519 sign (cryptography) — the guide's reference", lambda i: raw_private.sign(b"x" * 300)),
        (
            "http-message-signatures as-is (+digest)",
            lambda i: library.verify(library_message, max_age=None, body=body),
        ),
        ("ours: digest + signature + policy", lambda i: verifier.verify("POST", URL, headers, body, now=now)),
        ("ours + memory dedupe (claim+commit)", with_dedupe(MemoryDedupe())),
    ]
    redis_store: RedisDedupe | None = None
    try:
        redis_store = fresh_redis()
        redis_store.claim("usp-bench-probe")
        rows.append(("ours + Redis dedupe (claim+commit)", with_dedupe(redis_store)))
        if args.redis_url.startswith("redis://"):  # plain TCP (not TLS, not a unix socket)
            rows.append(("Redis round trip alone (PING, raw socket)", ping(args.redis_url)))
    except Exception as exc:  # the table still prints; the row says why it is missing
        print(f"Redis row skipped: {exc}")
    signed_params = sign_notification_params(event, key)
    rows.append(
        (
            "ours: in-band JWS of an MCP notification (usp_receiver.jose)",
            lambda i: verify_notification_params(signed_params, verifier_keys, now=now),
        )
    )
    rows.append(
        ("standardwebhooks HMAC-SHA256 verify", lambda i: hooks.verify(body, std_headers, json_parse=False))
    )
    rows += [
        (
            "ours: Standard Webhooks v1 verify",
            lambda i: standard_webhooks.verify(v1, body, secrets=[ours_secret]),
        ),
        (
            "ours: Standard Webhooks v1a verify",
            lambda i: standard_webhooks.verify(v1a, body, public_keys=[ours_public]),
        ),
        (
            "ours: Standard Webhooks v1 + v1a sign (a worker's extra per try)",
            lambda i: standard_webhooks.sign(
                msg_id, sent_at, body, secrets=[ours_secret], signing_keys=[ours_key]
            ),
        ),
    ]

    fresh = itertools.count()
    run = uuid.uuid4().hex[:8]

    def verified_id() -> str:
        verifier.verify("POST", URL, headers, body, now=now)
        return f"{json.loads(body)['event_id']}-{run}-{next(fresh)}"

    def async_row(make_store: Callable[[], DedupeStore], in_flight: int) -> Callable[[], float]:
        return lambda: concurrent_rate(make_store(), verified_id, args.seconds, in_flight)

    measures: list[tuple[str, Callable[[], float]]] = [
        (name, partial(rate, op, args.seconds)) for name, op in rows
    ]
    for in_flight in [int(n) for n in args.in_flight.split(",") if n.strip()]:
        stores: list[tuple[str, Callable[[], DedupeStore]]] = [("memory", MemoryDedupe)]
        if redis_store is not None:
            stores.append(("Redis", fresh_redis))
        for kind, make_store in stores:
            name = f"ours + {kind} dedupe, async, {in_flight} in flight"
            measures.append((name, async_row(make_store, in_flight)))
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, measure in measures:
            best[name] = max(best.get(name, 0.0), measure())
    results = list(best.items())
    floor = results[0][1]
    table = Table(title=f"Webhook verification, one core, {len(body)}-byte body")
    table.add_column("path")
    table.add_column("ops/s", justify="right")
    table.add_column("µs/op", justify="right")
    table.add_column("% of raw Ed25519", justify="right")
    for name, ops in results:
        table.add_row(name, f"{ops:,.0f}", f"{1e6 / ops:,.1f}", f"{100 * ops / floor:.0f}%")
    Console().print(table)
    if redis_store is not None:
        redis_store.close()
    if not args.no_node:
        inputs = {
            "url": URL,
            "headers": headers,
            "body": base64.b64encode(body).decode(),
            "jwk": dict(key.public.jwk),
            "now": now,
            "secret": ours_secret,
            "standard_headers": v1,
            "seconds": args.seconds,
            "rounds": args.rounds,
        }
        node_table(inputs, len(body))


def node_table(inputs: dict[str, object], size: int) -> None:
    """Run the Node.js receiver's rows on the same delivery and print them against Node's floor."""
    script = Path(__file__).resolve().parents[1] / "receiver-js" / "bench" / "verify.mjs"
    with tempfile.NamedTemporaryFile("w", suffix=".json") as handle:
        json.dump(inputs, handle)
        handle.flush()
        done = subprocess.run(
            ["node", str(script)],
            env=os.environ | {"USP_BENCH_INPUT": handle.name},
            capture_output=True,
            text=True,
            check=False,
        )
    if done.returncode != 0:
        print(f"Node.js rows skipped (build receiver-js first: npm ci && npm run build):\n{done.stderr}")
        return
    results = json.loads(done.stdout)
    floor = next(iter(results.values()))
    table = Table(title=f"Node.js receiver (@usp-webhooks/receiver), one core, {size}-byte body")
    table.add_column("path")
    table.add_column("ops/s", justify="right")
    table.add_column("µs/op", justify="right")
    table.add_column("% of Node's raw Ed25519", justify="right")
    for name, ops in results.items():
        table.add_row(name, f"{ops:,.0f}", f"{1e6 / ops:,.1f}", f"{100 * ops / floor:.0f}%")
    Console().print(table)


if __name__ == "__main__":
    main()
