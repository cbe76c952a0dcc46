"""What one relay pass costs as deliveries wait behind it, on PostgreSQL.

Run: ``uv run python bench/relay.py [--backlog 1000,10000,100000] [--subjects 10]``

The scheduler's relay looks for due deliveries every ``relay_interval_seconds`` (one second by
default): a pass holds the due ordered deliveries that wait behind an earlier one of their subject
(:func:`usp_workers.runtime.relay.hold_blocked`) and marks what may go
(:func:`usp_workers.runtime.relay.mark_due`); once per ``requeue_after_seconds`` a sweep releases
held ones whose subject is free (:func:`usp_workers.runtime.relay.release_held`). Per backlog
size, in a schema of its own (dropped at the end), statistics fresh (``ANALYZE``, as autovacuum
keeps them), it prints:

* **unordered, in flight**: the backlog is being delivered (claimed, not due): the baseline,
  fastest of five passes;
* **ordered, held back**: one subscription ordered by subject, ``--subjects`` subjects whose first
  delivery is in flight and the rest of the backlog pending and due behind them (an ordered
  endpoint that is slow or down): the first pass (it holds them), the fastest of the next four,
  and the sweep;
* **+ 100 unordered due** after that: the pass that sends them.

The rows are built with ``generate_series``, not through the engine: only the pass is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.pipeline

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine
from sqlmodel import Session

from bench.pipeline import DEFAULT_POSTGRES, database
from usp_core.clock import utcnow
from usp_core.db import make_engine
from usp_dispatcher.cli.config import Settings
from usp_workers.runtime.relay import hold_blocked, mark_due, release_held
from usp_workers.storage.migrate import upgrade
from usp_workers.storage.models import Ordering, Subscription

PASSES = 5
UNORDERED_DUE = 100

_EVENTS = sa.text(
    "INSERT INTO usp_events (id, event_type, occurred_at, created_at, payload)"
    " SELECT :prefix || g, 'booking.confirmed', now() - interval '1 hour', now() - interval '1 hour', '{}'"
    " FROM generate_series(1, :n) g"
)
#: Delivery g of ``n``: the first ``heads`` in flight, the others pending and due; ordered ones
#: round-robin over ``heads`` subjects, in emission order.
_DELIVERIES = sa.text(
    "INSERT INTO usp_deliveries (id, event_id, subscription_id, status, attempt_count,"
    " next_attempt_at, created_at, updated_at, subject_key, subject_order, lease_until)"
    " SELECT 'dlv_' || :prefix || g, :prefix || g, :subscription,"
    "  CASE WHEN g <= :heads THEN 'in_flight' ELSE 'pending' END, 0,"
    "  now() - interval '1 hour' + g * interval '1 millisecond', now(), now(),"
    "  CASE WHEN :ordered THEN 'bkg_' || (g % greatest(:heads, 1)) END,"
    "  CASE WHEN :ordered THEN lpad(g::text, 12, '0') END,"
    "  CASE WHEN g <= :heads THEN now() + interval '1 hour' END"
    " FROM generate_series(1, :n) g"
)


@contextmanager
def schema(postgres_url: str) -> Iterator[tuple[Engine, Settings]]:
    """A migrated PostgreSQL schema of its own (dropped at the end) and settings on it."""
    with database("postgresql", Path("."), postgres_url) as url:
        settings = Settings(_env_file=None, database_url=url)
        engine = make_engine(settings)
        try:
            upgrade(engine)
            yield engine, settings
        finally:
            engine.dispose()


def add(engine: Engine, prefix: str, n: int, *, ordering: Ordering, heads: int) -> None:
    """A subscription with ``n`` deliveries (see :data:`_DELIVERIES`)."""
    with Session(engine) as session:
        subscription = Subscription(url=f"https://{prefix}.example/hooks", ordering=ordering)
        session.add(subscription)
        session.commit()
        subscription_id = subscription.id
    values = {"prefix": prefix, "n": n, "subscription": subscription_id, "heads": heads}
    with engine.begin() as connection:
        connection.execute(_EVENTS, values)
        connection.execute(_DELIVERIES, values | {"ordered": ordering is Ordering.SUBJECT})
    analyze(engine)


def analyze(engine: Engine) -> None:
    with engine.begin() as connection:
        connection.execute(sa.text("ANALYZE"))


def one_pass(engine: Engine, settings: Settings) -> tuple[float, int]:
    """A pass as the relay makes it (without the sweep): its time in ms and how many deliveries it
    marked to send (a marked one is due again only after ``requeue_after_seconds``)."""
    start = time.perf_counter()
    now = utcnow()
    hold_blocked(engine, settings, now=now)
    marked = len(mark_due(engine, settings, now=now))
    return (time.perf_counter() - start) * 1000, marked


def timed(operation: Callable[[], object]) -> float:
    start = time.perf_counter()
    operation()
    return (time.perf_counter() - start) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", default="1000,10000,100000", help="comma-separated backlog sizes")
    parser.add_argument("--subjects", type=int, default=10, help="subjects of the ordered backlog")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    args = parser.parse_args()

    table = Table(title="One relay pass on PostgreSQL, by backlog (ms)")
    table.add_column("backlog", justify="right")
    table.add_column("unordered, in flight", justify="right")
    table.add_column("ordered, held back: first pass", justify="right")
    table.add_column("later passes", justify="right")
    table.add_column("sweep", justify="right")
    table.add_column(f"+ {UNORDERED_DUE} unordered due", justify="right")
    for n in [int(size) for size in args.backlog.split(",") if size.strip()]:
        with schema(args.postgres_url) as (engine, settings):
            add(engine, "u", n, ordering=Ordering.NONE, heads=n)
            in_flight = min(one_pass(engine, settings)[0] for _ in range(PASSES))
        with schema(args.postgres_url) as (engine, settings):
            add(engine, "o", n, ordering=Ordering.SUBJECT, heads=args.subjects)
            first, _ = one_pass(engine, settings)
            # Statistics as autovacuum's analyze leaves them after a change this size (it runs
            # within a minute); with the ones from before the hold, the planner expects the whole
            # backlog in the sendable range and scans it (~650 ms a pass at 100,000) until then.
            analyze(engine)
            later = min(one_pass(engine, settings)[0] for _ in range(PASSES - 1))
            sweep = timed(lambda: release_held(engine))
            add(engine, "m", UNORDERED_DUE, ordering=Ordering.NONE, heads=0)
            sending, marked = one_pass(engine, settings)
            assert marked == UNORDERED_DUE, f"{marked} of the {UNORDERED_DUE} due marked"
        table.add_row(f"{n:,}", *(f"{value:,.1f}" for value in (in_flight, first, later, sweep, sending)))
    Console().print(table)


if __name__ == "__main__":
    main()
