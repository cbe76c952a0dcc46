"""A soak: the whole service under steady load for minutes, every process's memory sampled.

Run: ``uv run python bench/soak.py [--minutes 15] [--rate 100] [--sessions 2] [--sample 30]``

Processes, as deployed, on this machine: the API (``usp-webhooks api``), ``--workers`` workers
(``usp-webhooks worker``), the scheduler (``usp-webhooks scheduler``), on PostgreSQL (a schema of
its own, dropped at the end) and Redis (database 12, flushed before and after), delivering to
the fast receiver of bench/pipeline.py. For ``--minutes``:

* producers post ``--rate`` events/s to ``POST /events`` (one subscription: one delivery each);
* ``--sessions`` MCP sessions/s are opened with the official client, call ``usp_catalog_list``
  and end, every other one with ``DELETE`` and the rest abandoned (their idle timeout,
  ``USP_MCP_SESSION_IDLE_SECONDS``, closes them).

Every ``--sample`` seconds it records each process's RSS and open file descriptors (its whole
process group). At the end it waits for every accepted event to reach the receiver, and prints
the samples, each process's growth after warm-up (MB/min over the run's last two thirds, or after
the idle timeout, whichever is later: the abandoned sessions it keeps are the warm-up) and the
verdict: events accepted, delivered, dead, and errors seen (producers, MCP).
"""

# ruff: noqa: E402 (the path fix below must run before the SDK is imported)

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder is first on sys.path, and bench/mcp.py would shadow the MCP SDK.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.*

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field

import httpx2
import sqlalchemy as sa
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.table import Table

from bench.api_process import api_server, group_open_files, group_rss_bytes
from bench.ingest import ADMIN_TOKEN, PLACEHOLDER, Connection
from bench.pipeline import DEFAULT_POSTGRES, DEFAULT_REDIS, Receiver, Stack, database, empty_broker, free_port
from usp_core.db import make_engine, session
from usp_dispatcher import access
from usp_dispatcher import database as dispatcher_database
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.storage.models import Subscription

IDLE_SECONDS = 300.0  #: USP_MCP_SESSION_IDLE_SECONDS's default


@dataclass
class Tally:
    accepted: int = 0
    producer_errors: int = 0
    sessions_closed: int = 0
    sessions_abandoned: int = 0
    session_errors: int = 0
    first_errors: list[str] = field(default_factory=list)

    def error(self, kind: str, text: str) -> None:
        if kind == "producer":
            self.producer_errors += 1
        else:
            self.session_errors += 1
        if len(self.first_errors) < 5:
            self.first_errors.append(f"{kind}: {text[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--rate", type=float, default=100.0, help="events posted per second")
    parser.add_argument("--sessions", type=float, default=2.0, help="MCP sessions opened per second")
    parser.add_argument("--sample", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--idle", type=float, default=IDLE_SECONDS, help="USP_MCP_SESSION_IDLE_SECONDS")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument("--redis-url", default=DEFAULT_REDIS, help="its database is flushed")
    args = parser.parse_args()

    stack = Stack()
    empty_broker("redis", args.redis_url)
    with (
        tempfile.TemporaryDirectory(prefix="usp-soak-") as name,
        database("postgresql", Path(name), args.postgres_url) as url,
    ):
        folder = Path(name)
        port = free_port()
        receiver = Receiver(port)
        env = {key: value for key, value in os.environ.items() if not key.startswith("USP_")}
        env |= {
            "USP_DATABASE_URL": url,
            "USP_BROKER_URL": args.redis_url,
            "USP_ADMIN_TOKEN": ADMIN_TOKEN,
            "USP_ALLOW_PRIVATE_TARGETS": "true",
            "USP_MCP_SESSION_IDLE_SECONDS": str(args.idle),
            "PYTHONUNBUFFERED": "1",
        }
        engine = make_engine(url)
        try:
            dispatcher_database.upgrade(engine)
            with session(engine) as s:
                s.add(Subscription(url=f"{receiver.base}/hook"))
                key = access.issue_api_key(s, "soak")
                s.commit()
            pipeline = str(Path(__file__).with_name("pipeline.py"))
            receiver.wait_ready(
                stack.start("receiver", [sys.executable, pipeline, "receiver", str(port)], env, folder)
            )
            cli = [sys.executable, "-m", "usp_dispatcher.cli"]
            for number in range(args.workers):
                stack.start(f"worker-{number}", [*cli, "worker"], env, folder).wait_for(" ready.")
            stack.start("scheduler", [*cli, "scheduler"], env, folder).wait_for("scheduler started")
            with api_server(env, folder, ready="/.well-known/usp") as api:
                groups = {"api": api.pid} | {p.name: p.process.pid for p in stack.processes}
                tally = Tally()
                samples = asyncio.run(run(args, api.base, key, groups, tally))
            delivered = wait_delivered(receiver, tally.accepted)
            statuses = delivery_statuses(engine)
        finally:
            stack.stop()
            engine.dispose()
    empty_broker("redis", args.redis_url)
    report(args, samples, tally, delivered, statuses)


async def run(
    args: argparse.Namespace, base: str, key: str, groups: dict[str, int], tally: Tally
) -> list[tuple[float, dict[str, tuple[int, int]]]]:
    """Load for ``--minutes`` while sampling; the samples: (seconds since start, {process: (RSS, fds)})."""
    start = time.monotonic()
    deadline = start + 60 * args.minutes
    samples: list[tuple[float, dict[str, tuple[int, int]]]] = []

    async def sampler() -> None:
        while True:
            moment = time.monotonic() - start
            samples.append(
                (
                    moment,
                    {name: (group_rss_bytes(pid), group_open_files(pid)) for name, pid in groups.items()},
                )
            )
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(min(args.sample, max(0.0, deadline - time.monotonic())))

    await asyncio.gather(
        sampler(),
        produce(base, args.rate, deadline, tally),
        sessions(base, key, args.sessions, deadline, tally),
    )
    return samples


async def produce(base: str, rate: float, deadline: float, tally: Tally, connections: int = 4) -> None:
    template = json.dumps(json.loads(BOOKING_CONFIRMED_EXAMPLE) | {"event_id": PLACEHOLDER}).encode()

    async def one(offset: float) -> None:
        connection = await Connection.open(base)
        interval = connections / rate
        due = time.monotonic() + offset
        try:
            while due < deadline:
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due += interval
                body = template.replace(PLACEHOLDER.encode(), new_event_id().encode())
                try:
                    status, answer = await connection.post("/events", body)
                except (OSError, asyncio.IncompleteReadError) as exc:
                    tally.error("producer", repr(exc))
                    connection.close()
                    connection = await Connection.open(base)
                    continue
                if status == 202:
                    tally.accepted += 1
                else:
                    tally.error("producer", f"{status} {answer!r}")
        finally:
            connection.close()

    await asyncio.gather(*(one(n / rate) for n in range(connections)))


async def sessions(base: str, key: str, per_second: float, deadline: float, tally: Tally) -> None:
    url = f"{base}/mcp"
    running: set[asyncio.Task[None]] = set()

    async def one(close: bool) -> None:
        try:
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=60)) as http:
                transport = streamable_http_client(url, http_client=http, terminate_on_close=close)
                async with Client(transport, mode="legacy") as client:
                    result = await client.call_tool("usp_catalog_list", {})
                    if result.is_error:
                        tally.error("mcp", str(result.content))
                        return
            if close:
                tally.sessions_closed += 1
            else:
                tally.sessions_abandoned += 1
        except Exception as exc:  # counted and reported: the soak must see none
            tally.error("mcp", repr(exc))

    number = 0
    due = time.monotonic()
    while due < deadline:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        due += 1 / per_second
        task = asyncio.create_task(one(close=number % 2 == 0))
        running.add(task)
        task.add_done_callback(running.discard)
        number += 1
    await asyncio.gather(*running)


def wait_delivered(receiver: Receiver, accepted: int, timeout: float = 180.0) -> int:
    deadline = time.monotonic() + timeout
    while (unique := receiver.stats()["unique"]) < accepted and time.monotonic() < deadline:
        time.sleep(0.5)
    return unique


def delivery_statuses(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(sa.text("SELECT status, count(*) FROM usp_deliveries GROUP BY status"))
        return {status: int(count) for status, count in rows}


def report(
    args: argparse.Namespace,
    samples: list[tuple[float, dict[str, tuple[int, int]]]],
    tally: Tally,
    delivered: int,
    statuses: dict[str, int],
) -> None:
    names = list(samples[0][1])
    table = Table(
        title=f"Soak: {args.minutes:g} min, {args.rate:g} events/s, {args.sessions:g} MCP sessions/s"
    )
    table.add_column("minute", justify="right")
    for name in names:
        table.add_column(f"{name} MB", justify="right")
        table.add_column("fds", justify="right")
    for moment, values in samples:
        cells = [f"{moment / 60:.1f}"]
        for name in names:
            rss, fds = values[name]
            cells += [f"{rss / 2**20:.1f}", str(fds)]
        table.add_row(*cells)
    warm = max(60 * args.minutes / 3, args.idle)
    after = [(moment, values) for moment, values in samples if moment >= warm]
    growth: dict[str, str] = defaultdict(lambda: "n/a (run longer than the warm-up)")
    if len(after) >= 3:
        minutes = [moment / 60 for moment, _ in after]
        for name in names:
            slope = statistics.linear_regression(
                minutes, [values[name][0] / 2**20 for _, values in after]
            ).slope
            growth[name] = f"{slope:+.2f} MB/min"
    table.add_section()
    table.add_row(
        f"growth after {warm / 60:.0f} min", *[cell for name in names for cell in (growth[name], "")]
    )
    Console(width=max(100, 24 * len(names) + 20)).print(table)
    lost = tally.accepted - delivered
    print(
        f"events: {tally.accepted:,} accepted, {delivered:,} delivered, {lost:,} lost; deliveries by status: "
        f"{statuses}; producer errors: {tally.producer_errors}; MCP sessions: {tally.sessions_closed:,} "
        f"closed, {tally.sessions_abandoned:,} abandoned, {tally.session_errors} errors"
    )
    for line in tally.first_errors:
        print("  first errors:", line)
    print("(the receiver keeps every event id it saw, so its memory grows by design)")
    if lost or tally.producer_errors or tally.session_errors or statuses.get("dead"):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
