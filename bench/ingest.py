"""How many events one API process accepts: ``POST /events`` one at a time and in batches.

Run: ``uv run python bench/ingest.py [--seconds 10] [--producers 16] [--batch 100]
[--database postgresql|sqlite]``

The API (``usp-webhooks api``, one uvicorn process) runs in a subprocess on 127.0.0.1 with the
production layout: PostgreSQL (a schema of its own, dropped at the end) and a Redis broker
(``--redis-url``, a database of its own that is flushed before and after: the bench runs no
workers, so the hand-off queue only fills). Two subscriptions match every event, so each event
is one event row and two delivery rows written and handed off. Producers are asyncio tasks in
this process, each with its own keep-alive connection, posting ``booking.confirmed`` events with
fresh ids for ``--seconds``:

* **single**: one event per ``POST /events``;
* **batch**: ``--batch`` events per ``POST /events/batch`` (one transaction, a result per event).

Per row: events/s, request latency p50/p99, the API process's CPU per event (``/proc``), and a
check that every accepted event is in the database with its deliveries (no loss).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.api_process

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass

import httpx
import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from bench.api_process import ApiProcess, api_server, cpu_seconds
from bench.pipeline import database, empty_broker
from bench.reference import in_signs, sign_rate
from usp_core import db
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.storage import migrate
from usp_workers.storage.models import Subscription

DEFAULT_POSTGRES = os.environ.get(
    "USP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ADMIN_TOKEN = "bench-admin-" + uuid.uuid4().hex
SUBSCRIPTIONS = 2


#: Every event the API accepted in this run, warm-ups included: what the database must hold.
accepted_total = [0]


@dataclass(frozen=True)
class Row:
    name: str
    events: int
    seconds: float
    latencies: list[float]
    cpu: float  #: the API process's CPU seconds
    producer_cpu: float  #: this process's (the producers')

    @property
    def rate(self) -> float:
        return self.events / self.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="time per row")
    parser.add_argument("--producers", type=int, default=24, help="concurrent producers")
    parser.add_argument("--batch", type=int, default=100, help="events per batch request")
    parser.add_argument("--database", choices=["postgresql", "sqlite"], default="postgresql")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("USP_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12"),
        help="broker; this Redis database is flushed before and after",
    )
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="usp-ingest-") as folder,
        database(args.database, Path(folder), args.postgres_url) as url,
    ):
        prepare(url)
        empty_broker("redis", args.redis_url)
        env = {
            "USP_DATABASE_URL": url,
            "USP_ADMIN_TOKEN": ADMIN_TOKEN,
            "USP_BROKER_URL": args.redis_url,
            "USP_ALLOW_PRIVATE_TARGETS": "true",
            "USP_SEED_DEMO_CATALOG": "false",
        }
        signs = sign_rate()
        try:
            with api_server(env, Path(folder), ready="/.well-known/usp") as api:
                rows = [
                    asyncio.run(measure(api, "single", args.producers, 1, args.seconds)),
                    asyncio.run(measure(api, "batch", args.producers, args.batch, args.seconds)),
                ]
            stored = count(url)
            signs = max(signs, sign_rate())
        finally:
            empty_broker("redis", args.redis_url)
    accepted = accepted_total[0]
    if stored != (accepted, accepted * SUBSCRIPTIONS):
        raise SystemExit(f"lost events: accepted {accepted}, stored (events, deliveries) {stored}")
    table = Table(title=f"POST /events, one API process, {args.database}, {args.producers} producers")
    columns = ("form", "events", "events/s", "p50 request", "p99 request", "API CPU/event", "producers' CPU")
    for column in columns:
        table.add_column(column, justify="left" if column == "form" else "right")
    for row in rows:
        latencies = sorted(row.latencies)
        table.add_row(
            row.name,
            f"{row.events:,}",
            f"{row.rate:,.0f}",
            f"{1000 * statistics.median(latencies):.1f} ms",
            f"{1000 * latencies[int(0.99 * (len(latencies) - 1))]:.1f} ms",
            f"{1e6 * row.cpu / row.events:,.0f} µs = {in_signs(row.cpu / row.events, signs):.1f} signs",
            f"{1e6 * row.producer_cpu / row.events:,.0f} µs",
        )
    Console().print(table)
    print(f"raw Ed25519 sign (cryptography, one core, this run): {signs:,.0f}/s, {1e6 / signs:.1f} µs")
    print(f"stored: {stored[0]:,} events, {stored[1]:,} deliveries (all accepted, none lost)")


async def measure(api: ApiProcess, name: str, producers: int, batch: int, seconds: float) -> Row:
    label = f"{name} ({batch} per request)" if batch > 1 else name
    template = json.dumps(json.loads(BOOKING_CONFIRMED_EXAMPLE) | {"event_id": PLACEHOLDER}).encode()
    path = "/events/batch" if batch > 1 else "/events"
    latencies: list[float] = []
    events = [0]

    def body() -> bytes:
        fresh = [template.replace(PLACEHOLDER.encode(), new_event_id().encode()) for _ in range(batch)]
        return b"[" + b",".join(fresh) + b"]" if batch > 1 else fresh[0]

    async def producer(deadline: float) -> None:
        connection = await Connection.open(api.base)
        try:
            while time.perf_counter() < deadline:
                content = body()
                start = time.perf_counter()
                status, answer = await connection.post(path, content)
                latencies.append(time.perf_counter() - start)
                if status not in (200, 202):
                    raise RuntimeError(f"{path} answered {status}: {answer[:300]!r}")
                if batch > 1 and json.loads(answer)["accepted"] != batch:
                    raise RuntimeError(f"a batch event was not accepted: {answer[:300]!r}")
                events[0] += batch
                accepted_total[0] += batch
        finally:
            connection.close()

    await asyncio.gather(*(producer(time.perf_counter() + 1.0) for _ in range(producers)))  # warm-up
    latencies.clear()
    events[0] = 0
    cpu, own = cpu_seconds(api.pid), time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(producer(start + seconds) for _ in range(producers)))
    elapsed = time.perf_counter() - start
    return Row(label, events[0], elapsed, latencies, cpu_seconds(api.pid) - cpu, time.process_time() - own)


PLACEHOLDER = "evt_placeholder_of_the_bench_000"


class Connection:
    """One keep-alive HTTP/1.1 connection that posts JSON and reads the answer.

    Hand-written for the load generator only: httpx cost the producers ~620 µs of CPU per request
    on the same cores as the API (as much as the API itself), so the bench measured its own
    client; this costs a tenth of that.
    """

    def __init__(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._host = host
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, base: str) -> Connection:
        url = httpx.URL(base)
        reader, writer = await asyncio.open_connection(url.host, url.port)
        return cls(f"{url.host}:{url.port}", reader, writer)

    async def post(self, path: str, content: bytes) -> tuple[int, bytes]:
        self._writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self._host}\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(content)}\r\n\r\n".encode()
            + content
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        sizes = [line.split(":", 1)[1] for line in lines if line.lower().startswith("content-length:")]
        return status, await self._reader.readexactly(int(sizes[0]))

    def close(self) -> None:
        self._writer.close()


def prepare(url: str) -> None:
    engine = db.make_engine(url)
    try:
        migrate.upgrade(engine)
        with db.session(engine) as session:
            for number in range(SUBSCRIPTIONS):
                session.add(Subscription(url=f"http://127.0.0.1:9/hook/{number}"))
            session.commit()
    finally:
        engine.dispose()


def count(url: str) -> tuple[int, int]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as connection:
            events = connection.execute(sa.text("SELECT count(*) FROM usp_events")).scalar_one()
            deliveries = connection.execute(sa.text("SELECT count(*) FROM usp_deliveries")).scalar_one()
            return int(events), int(deliveries)
    finally:
        engine.dispose()


if __name__ == "__main__":
    main()
