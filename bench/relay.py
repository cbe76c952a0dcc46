"""What one relay pass costs as deliveries wait behind it, on PostgreSQL.

Run: ``uv run python bench/relay.py [--backlog 1000,10000,100000] [--subjects 10]``

The scheduler's relay looks for due deliveries every ``relay_interval_seconds`` (one second by
default) with :func:`usp_workers.runtime.relay.mark_due`. Per backlog size, in a schema of its own
(dropped at the end), statistics fresh (``ANALYZE``, as autovacuum keeps them), it prints the
fastest of five passes (for the last row, the first: the one that sends) for:

* **unordered, in flight**: the backlog is being delivered (claimed, not due): the baseline;
* **ordered, blocked**: one subscription ordered by subject, ``--subjects`` subjects whose first
  delivery is in flight and the rest of the backlog pending and due behind them (an ordered
  endpoint that is slow or down): nothing can be sent;
* **the same + 100 unordered due**: what the pass costs the deliveries that could go.

The rows are built with ``generate_series``, not through the engine: only the pass is measured.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.pipeline

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine
from sqlmodel import Session

from bench.pipeline import DEFAULT_POSTGRES, database
from usp_workers.runtime.relay import mark_due
from usp_workers.settings import Settings
from usp_workers.storage.db import make_engine, upgrade
from usp_workers.storage.models import Ordering, Subscription, utcnow

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
        connection.execute(sa.text("ANALYZE"))


def passes(engine: Engine, settings: Settings) -> list[tuple[float, int]]:
    """:data:`PASSES` passes: each one's time in ms and how many deliveries it marked (a marked
    one is due again only after ``requeue_after_seconds``: the first pass marks, the others scan)."""
    done = []
    for _ in range(PASSES):
        start = time.perf_counter()
        marked = len(mark_due(engine, settings, now=utcnow()))
        done.append(((time.perf_counter() - start) * 1000, marked))
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", default="1000,10000,100000", help="comma-separated backlog sizes")
    parser.add_argument("--subjects", type=int, default=10, help="subjects of the ordered backlog")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    args = parser.parse_args()

    table = Table(title="One relay pass (mark_due) on PostgreSQL, by backlog")
    table.add_column("backlog", justify="right")
    for column in ("unordered, in flight", "ordered, blocked", f"+ {UNORDERED_DUE} unordered due"):
        table.add_column(f"{column}: ms", justify="right")
    for n in [int(size) for size in args.backlog.split(",") if size.strip()]:
        cells = [f"{n:,}"]
        for case in ("unordered", "ordered", "mixed"):
            with schema(args.postgres_url) as (engine, settings):
                if case == "unordered":
                    add(engine, "u", n, ordering=Ordering.NONE, heads=n)
                else:
                    add(engine, "o", n, ordering=Ordering.SUBJECT, heads=args.subjects)
                if case == "mixed":
                    add(engine, "m", UNORDERED_DUE, ordering=Ordering.NONE, heads=0)
                    ms, marked = passes(engine, settings)[0]  # the pass that sends them
                    assert marked == UNORDERED_DUE, f"{marked} of the {UNORDERED_DUE} due marked"
                else:
                    ms = min(ms for ms, _ in passes(engine, settings))
                cells.append(f"{ms:,.1f}")
        table.add_row(*cells)
    Console().print(table)


if __name__ == "__main__":
    main()
