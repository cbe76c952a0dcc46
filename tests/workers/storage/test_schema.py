"""The engine's migration chain and its table models describe the same schema.

A model field added without a revision (or a revision that drifts from the model) would pass
every test that builds tables from the migrations yet break a real upgrade, or the reverse; this
is the check that catches it, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from usp_core.clock import utcnow
from usp_core.db import Migrated, make_engine
from usp_workers.storage.migrate import MIGRATIONS, upgrade
from usp_workers.storage.models import Delivery, EventRecord, Subscription


def _engine_tables(name: str | None, type_: str, _parents: Any) -> bool:
    return type_ != "table" or (name is not None and name.startswith("usp_"))


def test_migrations_match_the_table_models(database: Engine) -> None:
    with database.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": _engine_tables}
        )
        assert compare_metadata(context, SQLModel.metadata) == []


def test_an_upgrade_reports_what_it_created_and_one_at_the_head_does_nothing(
    database: Engine, tmp_path: Path
) -> None:
    fresh = make_engine(f"sqlite:///{tmp_path / 'fresh.sqlite3'}")
    try:
        first = upgrade(fresh)
    finally:
        fresh.dispose()
    assert first.before is None
    assert first.after is not None
    assert {"usp_events", "usp_deliveries", "usp_attempts"} <= set(first.created)
    # ``database`` is at the head already: the fast path answers, on SQLite and PostgreSQL.
    assert upgrade(database) == Migrated(first.after, first.after, ())


def test_the_superseded_migration_marks_dead_deliveries_already_delivered_again(database: Engine) -> None:
    """Before 0005 a replay kept the dead row and added a newer one; the upgrade marks such rows
    superseded by the first newer delivery, and leaves a dead row nothing followed in the dead
    letter."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with database.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
    now = utcnow()
    with database.begin() as connection:
        connection.execute(
            sa.insert(_as_of_0004(Subscription)),
            {
                "id": "sub_1",
                "url": "https://a.example/h",
                "transport": "rest",
                "event_types": '["*"]',
                "state": "active",
                "consecutive_failures": 0,
                "breaker_state": "closed",
                "breaker_opens": 0,
                "created_at": now,
                "updated_at": now,
            },
        )
    with database.begin() as connection:  # the events table is as 0004 left it
        connection.execute(
            sa.insert(_as_of_0004(EventRecord)),
            [
                {
                    "id": event_id,
                    "event_type": "booking.confirmed",
                    "occurred_at": now,
                    "created_at": now,
                    "payload": "{}",
                }
                for event_id in ("evt_redriven", "evt_dead")
            ],
        )
    with database.begin() as connection:
        connection.execute(
            sa.insert(_as_of_0004(Delivery)),
            [
                _delivery("dlv_1", "evt_redriven", "dead", now),
                _delivery("dlv_2", "evt_redriven", "succeeded", now),
                _delivery("dlv_3", "evt_redriven", "dead", now),
                _delivery("dlv_4", "evt_dead", "dead", now),
            ],
        )
    upgrade(database)
    with database.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT id, status, superseded_by FROM usp_deliveries ORDER BY id")
        ).all()
    assert [tuple(row) for row in rows] == [
        ("dlv_1", "superseded", "dlv_2"),
        ("dlv_2", "succeeded", None),
        ("dlv_3", "dead", None),
        ("dlv_4", "dead", None),
    ]


#: Columns later migrations added.
_AFTER_0004 = {
    "superseded_by",
    "subject_key",
    "subject_order",
    "ordering",
    "on_dead",
    "traceparent",
    "key_ids",
}


def _as_of_0004(model: type[SQLModel]) -> sa.TableClause:
    table = SQLModel.metadata.tables[str(model.__tablename__)]
    columns = [sa.column(c.name, c.type) for c in table.columns if c.name not in _AFTER_0004]
    return sa.table(table.name, *columns)


def _delivery(delivery_id: str, event_id: str, status: str, now: datetime) -> dict[str, Any]:
    return {
        "id": delivery_id,
        "event_id": event_id,
        "subscription_id": "sub_1",
        "status": status,
        "attempt_count": 1,
        "next_attempt_at": now,
        "created_at": now,
        "updated_at": now,
    }


def test_alembic_is_imported_by_a_migration_not_by_starting_a_process(tmp_path: Path) -> None:
    """Workers, the scheduler and the CLI import the storage layer at start; Alembic, ~0.14 s of
    CPU of every such start, only comes in when a process runs the migrations."""
    url = f"sqlite:///{tmp_path / 'usp.sqlite3'}"
    probe = (
        "import sys\n"
        "import usp_workers.runtime.tasks, usp_dispatcher.cli\n"
        "print('alembic' in sys.modules)\n"
        "from usp_core.db import make_engine\nfrom usp_workers.storage.migrate import upgrade\n"
        f"upgrade(make_engine({url!r}))\n"
        "print('alembic' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]
