"""What one SQL statement costs the API process in CPU, by the layer it goes through: the floor
under every request-path row (a booking runs about ten statements).

Run: ``uv run python bench/statements.py [--reads 3000] [--databases postgresql,sqlite]``

The same primary-key read of a catalog service, on a fresh database per kind, four ways:

* **ORM, fresh session**: ``Session.get`` in a session of its own (what a request with its own
  transaction pays: the pool checkout with its pre-ping, the session, the rollback at close);
* **ORM, open session**: ``Session.get(..., populate_existing=True)`` in one session;
* **Core**: a compiled-once ``select`` on one connection;
* **driver**: the DBAPI cursor (psycopg or sqlite3) with the SQL written out.

It prints CPU per read (``time.process_time``: this process only, so a PostgreSQL round trip's
server side is not in it) in µs and in raw Ed25519 signatures of the same run, the sign rate
measured before and after (the table shows the slower of the two).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import os
import tempfile
import time
from collections.abc import Callable

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from bench.pipeline import database
from bench.reference import in_signs, sign_rate
from usp_core import db
from usp_dispatcher import database as dispatcher_database
from usp_dispatcher import scheduling
from usp_dispatcher.scheduling.tables import ServiceRow

DEFAULT_POSTGRES = os.environ.get(
    "USP_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
SERVICE = "svc_bench_statements"
WAYS = ("ORM, fresh session", "ORM, open session", "Core", "driver")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reads", type=int, default=3000, help="counted reads per way and database")
    parser.add_argument("--databases", default="postgresql,sqlite")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    args = parser.parse_args()
    rates = [sign_rate()]
    rows: list[tuple[str, list[float]]] = []
    for kind in [kind.strip() for kind in args.databases.split(",") if kind.strip()]:
        with (
            tempfile.TemporaryDirectory(prefix="usp-bench-statements-") as folder,
            database(kind, Path(folder), args.postgres_url) as url,
        ):
            rows.append((kind, measure(url, args.reads)))
    rates.append(sign_rate())
    signs = min(rates)
    table = Table(title="One primary-key read: API CPU by layer")
    table.add_column("database")
    for way in WAYS:
        table.add_column(way, justify="right")
    for kind, seconds in rows:
        table.add_row(kind, *(f"{s * 1e6:,.0f} µs = {in_signs(s, signs):.1f} signs" for s in seconds))
    console = Console(width=150)
    console.print(table)
    console.print(
        f"raw Ed25519 sign (cryptography, one core, this run): {signs:,.0f}/s, {1e6 / signs:.1f} µs"
        f" (before {rates[0]:,.0f}/s, after {rates[1]:,.0f}/s)"
    )


def measure(url: str, reads: int) -> list[float]:
    """CPU seconds per read, for each of :data:`WAYS`."""
    engine = db.make_engine(url)
    try:
        dispatcher_database.upgrade(engine)
        with db.session(engine) as session:
            spec = scheduling.ServiceSpec(name="Bench", duration_minutes=30, capacity=1, id=SERVICE)
            scheduling.create_service(session, spec, announce=False)
            session.commit()
        return [_per_read(way, reads) for way in _ways(engine)]
    finally:
        engine.dispose()


def _ways(engine: sa.Engine) -> list[Callable[[int], None]]:
    table = ServiceRow.__table__  # type: ignore[attr-defined]
    core = sa.select(table).where(table.c.id == SERVICE)
    placeholder = "%s" if engine.dialect.name == "postgresql" else "?"
    sql = f"SELECT * FROM {table.name} WHERE id = {placeholder}"  # noqa: S608 - our own table's name

    def fresh(reads: int) -> None:
        for _ in range(reads):
            with db.session(engine) as session:
                assert session.get(ServiceRow, SERVICE) is not None

    def open_session(reads: int) -> None:
        with db.session(engine) as session:
            for _ in range(reads):
                assert session.get(ServiceRow, SERVICE, populate_existing=True) is not None

    def core_reads(reads: int) -> None:
        with engine.connect() as connection:
            for _ in range(reads):
                assert connection.execute(core).first() is not None

    def driver(reads: int) -> None:
        with engine.connect() as connection:
            cursor = connection.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
            for _ in range(reads):
                cursor.execute(sql, (SERVICE,))
                assert cursor.fetchone() is not None
            cursor.close()

    return [fresh, open_session, core_reads, driver]


def _per_read(way: Callable[[int], None], reads: int) -> float:
    way(max(50, reads // 20))  # warm: compiled-statement caches, the pool, the plan
    started = time.process_time()
    way(reads)
    return (time.process_time() - started) / reads


if __name__ == "__main__":
    main()
