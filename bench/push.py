"""Live push latency: a request that commits an event, to the ``usp_webhook`` on a platform's MCP
stream, for a 2025 session (``mode="legacy"``, attached by a privileged call) and a 2026-07-28
``subscriptions/listen`` stream, with the event committed by the listener's own API process or by
a second one on the same database.

Run: ``uv run python bench/push.py [--events 200] [--database postgresql|sqlite]``

Two ``usp-webhooks api`` processes (A and B) run on 127.0.0.1 on a fresh database (a PostgreSQL
schema of its own, dropped at the end, or a SQLite file). A platform (an API key, a subscription
to ``booking.*``) holds one session or stream open to A with the official Python client, and
verifies and deduplicates what it hears with ``usp_receiver.mcp.NotificationBinding``. The bench
then posts events one at a time (``POST /events`` as the business) to A or to B and waits for each
to arrive: the time from sending the request to the notification's arrival, which holds the
request, the commit, the hub's wake-up (A's own commit hook, or PostgreSQL's ``NOTIFY`` for B's
commits; on SQLite B's commits wait for A's 0.2 s poll), the signing and the client's
verification. A third case commits the event from the bench's own process (as a worker would) and
times from the commit's return: the commit-to-notification latency itself. It prints p50/p95/p99
per case and the raw Ed25519 sign rate of the same run.
"""

# ruff: noqa: E402 (the path fix below must run before the SDK is imported)

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a file named mcp.py: run as a script, its folder would come first on sys.path and
# it would be imported in place of the MCP SDK.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.*

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass

import httpx
import httpx2
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine

from bench.api_process import ApiProcess
from bench.api_process import api_server as run_api
from bench.mcp import ADMIN_TOKEN, database
from bench.reference import sign_rate
from usp_core import db
from usp_dispatcher import access
from usp_dispatcher.webhooks.samples import sample_event
from usp_receiver import JWKS
from usp_receiver.dedupe import MemoryDedupe
from usp_receiver.mcp import NotificationBinding, ReceivedNotification, listen
from usp_workers.engine import outbox
from usp_workers.storage.models import Subscription

PROFILE = "https://bench.example/profiles/listener.json"
PATIENCE = 10.0


@dataclass(frozen=True)
class Case:
    mode: str  # "legacy" or "2026"
    via: str  # "A" (the listener's process) or "B"
    latencies_ms: list[float]
    answered_ms: list[float]  # the request's own answer


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=200, help="events per case")
    parser.add_argument("--warmup", type=int, default=20, help="uncounted events per case first")
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="postgresql")
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("USP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    args = parser.parse_args()
    console = Console(width=max(120, shutil.get_terminal_size().columns))
    raw_signs = sign_rate()
    with (
        tempfile.TemporaryDirectory(prefix="usp-bench-push-") as folder,
        database(args, Path(folder)) as url,
        api(url, Path(folder), "a") as a,
        api(url, Path(folder), "b") as b,
    ):
        key = prepare(url)
        cases = asyncio.run(measure(a, b, url, key, args.events, args.warmup))
    after = sign_rate()
    table = Table(
        title=f"usp_webhook push latency, request -> notification received ({args.database}, "
        f"{args.events} events a case, {os.cpu_count()} cores)"
    )
    columns = (
        "MCP",
        "event committed by",
        "p50",
        "p95",
        "p99",
        "max",
        "p50 in raw signs",
        "request alone p50",
    )
    for column in columns:
        table.add_column(column, justify="right")
    per_sign_ms = 1000 / ((raw_signs + after) / 2)
    for case in cases:
        ordered = sorted(case.latencies_ms)
        p50 = statistics.median(ordered)
        table.add_row(
            "2025 session (legacy)" if case.mode == "legacy" else "2026 listen stream",
            {"A": "the listener's API process", "B": "another API process", "here": "this process"}[case.via],
            f"{p50:.1f} ms",
            f"{ordered[int(len(ordered) * 0.95) - 1]:.1f} ms",
            f"{ordered[int(len(ordered) * 0.99) - 1]:.1f} ms",
            f"{ordered[-1]:.1f} ms",
            f"{p50 / per_sign_ms:,.0f}",
            f"{statistics.median(case.answered_ms):.1f} ms" if case.answered_ms else "(from the commit)",
        )
    console.print(table)
    console.print(f"raw Ed25519 signs/s, one core (300 bytes): {raw_signs:,.0f} before, {after:,.0f} after")


async def measure(a: ApiProcess, b: ApiProcess, url: str, key: str, events: int, warmup: int) -> list[Case]:
    engine = db.make_engine(url)
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            keys = JWKS.from_json((await http.get(f"{a.base}/.well-known/usp/jwks.json")).content)
            cases = []
            for mode in ("legacy", "2026"):
                async with platform(a, key, keys, mode) as heard:
                    for via in ("A", "B"):
                        target = a if via == "A" else b
                        await push(http, target, heard, warmup)
                        cases.append(Case(mode, via, *await push(http, target, heard, events)))
                    await commit_here(engine, heard, warmup)
                    cases.append(Case(mode, "here", await commit_here(engine, heard, events), []))
    finally:
        engine.dispose()
    return cases


async def commit_here(engine: Engine, heard: Heard, count: int) -> list[float]:
    """Events committed by this process (as a worker would), timed from the commit's return."""
    latencies = []
    for _ in range(count):
        body = sample_event("booking.confirmed")
        event_id = json.loads(body)["event_id"]
        arrived = heard.expect(event_id)
        committed = await asyncio.to_thread(_commit, engine, body)
        async with asyncio.timeout(PATIENCE):
            await arrived.wait()
        latencies.append((heard.arrivals[event_id] - committed) * 1000)
    return latencies


def _commit(engine: Engine, body: str) -> float:
    with db.session(engine) as session:
        outbox.emit(session, body)
        session.commit()
    return time.perf_counter()


async def push(
    http: httpx.AsyncClient, target: ApiProcess, heard: Heard, count: int
) -> tuple[list[float], list[float]]:
    latencies, answered = [], []
    for _ in range(count):
        body = sample_event("booking.confirmed")
        event_id = json.loads(body)["event_id"]
        arrived = heard.expect(event_id)
        started = time.perf_counter()
        answer = await http.post(
            f"{target.base}/events",
            content=body,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
        )
        answer.raise_for_status()
        answered.append((time.perf_counter() - started) * 1000)
        async with asyncio.timeout(PATIENCE):
            await arrived.wait()
        latencies.append((heard.arrivals[event_id] - started) * 1000)
    return latencies, answered


class Heard:
    """What the platform's binding handled, with when."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self._waiting: dict[str, asyncio.Event] = {}

    def expect(self, event_id: str) -> asyncio.Event:
        self._waiting[event_id] = asyncio.Event()
        return self._waiting[event_id]

    async def __call__(self, notification: ReceivedNotification) -> None:
        event_id = notification.event.event_id
        self.arrivals[event_id] = time.perf_counter()
        waiting = self._waiting.pop(event_id, None)
        if waiting is not None:
            waiting.set()


@asynccontextmanager
async def platform(a: ApiProcess, key: str, keys: JWKS, mode: str) -> AsyncIterator[Heard]:
    """The platform on A: a 2025 session attached by a privileged call, or a 2026 listen stream."""
    heard = Heard()
    binding = NotificationBinding(keys=keys, dedupe=MemoryDedupe(), handler=heard)
    usp = {"_meta": {"usp": {"profile": PROFILE}}}
    async with AsyncExitStack() as stack:
        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {key}"}, timeout=httpx2.Timeout(30, read=None)
            )
        )
        transport = streamable_http_client(f"{a.base}/mcp", http_client=http)
        client = await stack.enter_async_context(
            Client(transport, extensions=[binding.extension], mode="legacy")
            if mode == "legacy"
            else Client(transport, extensions=[binding.extension])
        )
        if mode == "legacy":
            await client.call_tool("usp_feed_subscriptions_list", usp)  # attaches the session
            yield heard
            return
        listening = asyncio.create_task(listen(client.session, profile=PROFILE))
        await asyncio.sleep(0.5)  # the stream is acknowledged and attached
        try:
            yield heard
        finally:
            listening.cancel()


def prepare(url: str) -> str:
    """The platform's API key and its subscription to ``booking.*``."""
    engine = db.make_engine(url)
    try:
        with db.session(engine) as session:
            session.add(
                Subscription(
                    url="http://127.0.0.1:9/hooks", platform_profile=PROFILE, event_types='["booking.*"]'
                )
            )
            session.commit()
            return access.issue_api_key(session, "bench-platform")
    finally:
        engine.dispose()


@contextmanager
def api(url: str, folder: Path, name: str) -> Iterator[ApiProcess]:
    """``usp-webhooks api`` number ``name`` on the shared database, in a folder of its own."""
    (home := folder / name).mkdir()
    env = {
        "USP_DATABASE_URL": url,
        "USP_ADMIN_TOKEN": ADMIN_TOKEN,
        "USP_BROKER_URL": f"sqla+sqlite:///{folder / 'broker.sqlite3'}",
        "USP_SEED_DEMO_CATALOG": "false",
        "USP_ALLOW_PRIVATE_TARGETS": "true",
    }
    with run_api(env, home, ready="/.well-known/usp") as process:
        yield process


if __name__ == "__main__":
    main()
