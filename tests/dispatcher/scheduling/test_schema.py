"""The domain's own migration chain: created only by Alembic, after the engine's, by every entry
point (``usp-webhooks migrate``, the API's start-up), and invisible to the engine's chain."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel
from typer.testing import CliRunner

from tests.dispatcher.conftest import MakeClient
from usp_dispatcher import cli, database
from usp_workers.storage import migrate

pytestmark = pytest.mark.empty_database

DOMAIN_TABLES = {
    "sched_services",
    "sched_slots",
    "sched_bookings",
    "sched_waitlist_entries",
    "sched_idempotency_keys",
    "sched_api_keys",
    "sched_principal_profiles",
    "access_nonces",
    "ucap_publications",
    "ucap_aliases",
    "ucap_tiers",
    "ucap_posts",
    "ucap_post_tiers",
    "ucap_categories",
    "ucap_subscriptions",
    "ucap_entitlements",
    "ucap_checkouts",
}


def tables(engine: Engine) -> set[str]:
    engine.dispose()  # forget cached metadata
    return set(sa.inspect(engine).get_table_names())


def _head(migrations: Path) -> str | None:
    config = Config()
    config.set_main_option("script_location", str(migrations))
    return ScriptDirectory.from_config(config).get_current_head()


def test_upgrade_runs_both_chains_with_their_own_version_tables(engine: Engine) -> None:
    database.upgrade(engine)
    present = tables(engine)
    assert present >= DOMAIN_TABLES
    assert {"usp_events", "usp_deliveries", "alembic_version", "alembic_version_dispatcher"} <= present
    with engine.connect() as connection:
        assert connection.execute(
            sa.text("SELECT version_num FROM alembic_version_dispatcher")
        ).scalar() == _head(database.MIGRATIONS)
        assert connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == _head(
            migrate.MIGRATIONS
        )
    database.upgrade(engine)  # idempotent
    assert tables(engine) == present


def test_engine_chain_alone_creates_no_domain_table(engine: Engine) -> None:
    migrate.upgrade(engine)
    assert not DOMAIN_TABLES & tables(engine)


def test_domain_tables_live_on_their_own_metadata() -> None:
    assert set(database.METADATA.tables) == DOMAIN_TABLES
    assert not DOMAIN_TABLES & set(SQLModel.metadata.tables)


def test_migrate_command_creates_the_domain_tables(database_url: str, engine: Engine) -> None:
    result = CliRunner().invoke(cli.app, ["migrate"], env={"USP_DATABASE_URL": database_url})
    assert result.exit_code == 0, result.output
    assert tables(engine) >= DOMAIN_TABLES


def test_api_start_migrates_both_chains(make_client: MakeClient, engine: Engine) -> None:
    make_client()
    assert DOMAIN_TABLES | {"usp_events"} <= tables(engine)


def test_migration_matches_the_table_models(engine: Engine) -> None:
    """Autogenerate against the migrated database finds nothing to do: the revision files and the
    ``DispatcherTable`` models describe the same schema (types included)."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    database.upgrade(engine)
    with engine.connect() as connection:
        context = MigrationContext.configure(
            connection,
            opts={
                "compare_type": True,
                "include_name": lambda name, type_, _parents: type_ != "table" or name in DOMAIN_TABLES,
            },
        )
        assert compare_metadata(context, database.METADATA) == []
