"""The MCP layer's cost: ``usp_bookings_create`` over Streamable HTTP with the official SDK client,
against the same operation through the REST route, in the same run on the same server.

Run: ``uv run python bench/mcp.py [--calls 500] [--concurrency 1,4] [--database sqlite|postgresql]``

The API (``usp-webhooks api``: REST and ``/mcp`` in one uvicorn process) runs in a subprocess on
127.0.0.1, on a fresh database (a SQLite file, or a PostgreSQL schema of its own dropped at the
end). A bench service gets ``--slots`` slots (one by default) with a seat per call, so every
call books (``pending`` booking, ``booking.created`` and ``catalog.availability.changed`` in the
outbox) and none is refused. Both bindings end in the same service function and the same
``perform`` transaction; what differs is the front end:

* **REST**: ``POST /services/bookings`` with ``httpx.AsyncClient``, twice: as the business
  (admin bearer token: no key lookup, no profile) and as the platform the MCP caller is (the same
  API key, its profile in ``USP-Agent``: the same authentication and profile binding);
* **MCP**: ``tools/call usp_bookings_create`` on a stateful Streamable HTTP session (handshake
  protocol, ``mcp.Client(..., mode="legacy")``), an API key in the ``Authorization`` header and
  ``_meta.usp.profile`` in the arguments: JSON-RPC framing, the SDK's session manager and SSE
  response, ``authorize`` (key lookup, profile binding), the booking-scoped credential it issues.

Per concurrency level (callers each with their own connection or session, calls split evenly) it
prints calls/s for each, the ratio MCP / REST as the same platform (the MCP layer's cost) and the
API process's CPU per call, in ms and in raw Ed25519 signatures of the same run (the sign rate
printed below the table); ``--warmup`` calls per caller are not counted.
"""

# ruff: noqa: E402 (the path fix below must run before the SDK is imported)

from __future__ import annotations

import sys
from pathlib import Path

# This file is named mcp.py: run as a script, its folder is first on sys.path and it would be
# imported in place of the MCP SDK.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.api_process

import argparse
import asyncio
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import httpx2
import sqlalchemy as sa
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from rich.console import Console
from rich.table import Table

from bench.api_process import ApiProcess, cpu_seconds
from bench.api_process import api_server as run_api
from bench.reference import in_signs, sign_rate
from usp_core import db
from usp_dispatcher import access, scheduling

DEFAULT_POSTGRES = os.environ.get(
    "USP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
ADMIN_TOKEN = "bench-admin-" + uuid.uuid4().hex
PROFILE = "https://bench.example/profiles/agent.json"
SERVICE = "svc_bench_001"


def slot_id(number: int) -> str:
    return f"slot_bench_{number:03d}"


BUYER = {"first_name": "Bench", "email": "bench@example.com"}
Call = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class Rate:
    calls_per_second: float
    api_cpu_ms: float  #: the API process's CPU per counted call


@dataclass(frozen=True)
class Row:
    concurrency: int
    business: Rate  #: REST with the admin token
    rest: Rate  #: REST as the platform (its API key and profile)
    mcp: Rate


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="counted calls per binding and level")
    parser.add_argument("--concurrency", default="1,4", help="comma-separated numbers of callers")
    parser.add_argument("--warmup", type=int, default=10, help="uncounted calls per caller first")
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        help="slots the callers book, caller n the (n mod slots)-th: 1 makes every booking wait for "
        "the one before it (the slot's row lock is held to commit); as many as callers, none waits",
    )
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",") if level.strip()]
    console = Console(width=max(150, shutil.get_terminal_size().columns))
    with tempfile.TemporaryDirectory(prefix="usp-bench-mcp-") as folder, database(args, Path(folder)) as url:
        seats = (args.calls + args.warmup * max(levels)) * len(levels) * 3 + 10
        with api_server(url, Path(folder)) as api:
            key = prepare(url, seats, args.slots)
            console.print(
                f"API at {api.base} ({args.database}); {args.calls} counted calls per binding and level"
            )
            signs = sign_rate()
            rows = [
                asyncio.run(measure(api, key, level, args.calls, args.warmup, args.slots)) for level in levels
            ]
            signs = max(signs, sign_rate())
    table = Table(
        title=f"usp_bookings_create: MCP (Streamable HTTP, SDK client) vs REST, {os.cpu_count()} cores"
    )
    columns = ("callers", "calls/s: REST business", "REST platform", "MCP platform", "MCP / REST platform")
    for column in (*columns, "API CPU/call: REST business", "REST platform", "MCP platform"):
        table.add_column(column, justify="right")
    for row in rows:
        rates = (row.business, row.rest, row.mcp)
        table.add_row(
            str(row.concurrency),
            *(f"{rate.calls_per_second:,.0f}" for rate in rates),
            f"{row.mcp.calls_per_second / row.rest.calls_per_second:.2f}",
            *(
                f"{rate.api_cpu_ms:.2f} ms = {in_signs(rate.api_cpu_ms / 1000, signs):.0f} signs"
                for rate in rates
            ),
        )
    console.print(table)
    console.print(
        f"raw Ed25519 sign (cryptography, one core, this run): {signs:,.0f}/s, {1e6 / signs:.1f} µs"
    )


# ------------------------------------------------------------------------------------ measuring


async def measure(api: ApiProcess, key: str, callers: int, calls: int, warmup: int, slots: int) -> Row:
    per_caller = max(1, calls // callers)
    business = await _rate(
        api,
        [_rest_caller(api.base, ADMIN_TOKEN, slot_id(n % slots)) for n in range(callers)],
        per_caller,
        warmup,
    )
    rest = await _rate(
        api,
        [_rest_caller(api.base, key, slot_id(n % slots), profile=PROFILE) for n in range(callers)],
        per_caller,
        warmup,
    )
    mcp = await _rate(
        api, [_mcp_caller(api.base, key, slot_id(n % slots)) for n in range(callers)], per_caller, warmup
    )
    return Row(callers, business, rest, mcp)


async def _rate(api: ApiProcess, callers: list[Any], per_caller: int, warmup: int) -> Rate:
    """Calls/s of ``callers`` (async context managers yielding a :data:`Call`) running together,
    and the API process's CPU per call meanwhile."""
    async with _all(callers) as calls:
        await asyncio.gather(*(_repeat(call, warmup) for call in calls))
        cpu = cpu_seconds(api.pid)
        started = time.perf_counter()
        await asyncio.gather(*(_repeat(call, per_caller) for call in calls))
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(api.pid) - cpu
    counted = per_caller * len(callers)
    return Rate(counted / elapsed, cpu * 1000 / counted)


async def _repeat(call: Call, times: int) -> None:
    for _ in range(times):
        await call()


@asynccontextmanager
async def _all(callers: list[Any]) -> AsyncIterator[list[Call]]:
    entered: list[Call] = []
    exits = []
    try:
        for caller in callers:
            entered.append(await caller.__aenter__())
            exits.append(caller)
        yield entered
    finally:
        for caller in reversed(exits):
            await caller.__aexit__(None, None, None)


@asynccontextmanager
async def _rest_caller(
    base: str, token: str, slot: str, *, profile: str | None = None
) -> AsyncIterator[Call]:
    headers = {"Authorization": f"Bearer {token}"}
    if profile is not None:
        headers["USP-Agent"] = f'profile="{profile}"'
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as http:

        async def call() -> None:
            response = await http.post(
                "/services/bookings", json={"service_id": SERVICE, "slot_id": slot, "buyer": BUYER}
            )
            if response.status_code != 201:
                raise RuntimeError(f"REST booking failed: {response.status_code} {response.text[:200]}")

        yield call


@asynccontextmanager
async def _mcp_caller(base: str, key: str, slot: str) -> AsyncIterator[Call]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=300)) as http:
        transport = streamable_http_client(f"{base}/mcp", http_client=http)
        async with Client(transport, mode="legacy") as client:
            arguments = {
                "service_id": SERVICE,
                "slot_id": slot,
                "buyer": BUYER,
                "_meta": {"usp": {"profile": PROFILE}},
            }

            async def call() -> None:
                result = await client.call_tool("usp_bookings_create", arguments)
                body = result.structured_content or {}
                if "booking" not in body:
                    raise RuntimeError(f"MCP booking failed: {body.get('messages')}")

            yield call


# ------------------------------------------------------------------------------------ set-up


def prepare(url: str, seats: int, slots: int) -> str:
    """The bench service with ``slots`` slots of ``seats`` seats, and an API key for the platform."""
    engine = db.make_engine(url)
    try:
        with db.session(engine) as session:
            scheduling.create_service(
                session,
                scheduling.ServiceSpec(name="Bench", duration_minutes=30, capacity=seats, id=SERVICE),
                announce=False,
            )
            session.commit()
            start = datetime.now(UTC).replace(microsecond=0) + timedelta(days=2)
            for number in range(slots):
                moment = start + timedelta(hours=number)
                scheduling.add_slot(
                    session, SERVICE, moment, capacity=seats, slot_id=slot_id(number), announce=False
                )
            session.commit()
            return access.issue_api_key(session, "bench")
    finally:
        engine.dispose()


@contextmanager
def database(args: argparse.Namespace, folder: Path) -> Iterator[str]:
    if args.database == "sqlite":
        yield f"sqlite:///{folder / 'bench.sqlite3'}"
        return
    schema = f"usp_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(args.postgres_url)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        yield (
            sa.make_url(args.postgres_url)
            .update_query_dict({"options": f"-csearch_path={schema}"})
            .render_as_string(hide_password=False)
        )
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@contextmanager
def api_server(url: str, folder: Path) -> Iterator[ApiProcess]:
    """``usp-webhooks api`` on ``url``'s database (:func:`bench.api_process.api_server`)."""
    env = {
        "USP_DATABASE_URL": url,
        "USP_ADMIN_TOKEN": ADMIN_TOKEN,
        "USP_BROKER_URL": f"sqla+sqlite:///{folder / 'broker.sqlite3'}",
        "USP_SEED_DEMO_CATALOG": "false",
    }
    with run_api(env, folder, ready="/.well-known/usp") as api:
        yield api


if __name__ == "__main__":
    main()
