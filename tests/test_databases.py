"""The test databases (``tests.databases``): a pooled schema comes back without the last test's
rows, a schema a test reshaped is never handed out again, a SQLite copy is migrated."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from tests.databases import migrated_schema, migrated_sqlite
from usp_core.db import make_engine, session
from usp_core.keys import rotate
from usp_dispatcher.cli.config import Settings
from usp_workers.storage.migrate import upgrade


def _keys(url: str) -> int:
    """The signing keys the database held; it holds one more after."""
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            held = int(connection.execute(sa.text("SELECT count(*) FROM usp_signing_keys")).scalar_one())
        with session(engine) as s:
            rotate(s, Settings(_env_file=None, key_store_path=None))
            s.commit()
        return held
    finally:
        engine.dispose()


def test_a_pooled_schema_comes_back_empty_and_a_reshaped_one_is_dropped(postgres_url: str) -> None:
    with migrated_schema(postgres_url, upgrade) as first:
        assert _keys(first) == 0
        assert _keys(first) == 1
    with migrated_schema(postgres_url, upgrade) as again:
        assert again == first, "the same schema, reused"
        assert _keys(again) == 0, "the last test's keys are gone"
        engine = sa.create_engine(again)
        with engine.begin() as connection:
            connection.execute(sa.text("DROP TABLE usp_attempts"))
        engine.dispose()
    with migrated_schema(postgres_url, upgrade) as fresh:
        assert fresh != first
        assert _keys(fresh) == 0
    schema = str(sa.make_url(first).query["options"]).removeprefix("-csearch_path=")
    admin = sa.create_engine(postgres_url)
    with admin.connect() as connection:
        assert connection.execute(sa.text("SELECT to_regnamespace(:s)"), {"s": schema}).scalar() is None
    admin.dispose()


def test_a_sqlite_copy_is_migrated_and_its_own(tmp_path: Path) -> None:
    one = migrated_sqlite(tmp_path / "one.sqlite3", upgrade)
    two = migrated_sqlite(tmp_path / "two.sqlite3", upgrade)
    assert _keys(one) == 0
    assert _keys(one) == 1
    assert _keys(two) == 0, "a copy of its own"


def _with_a_key(engine: sa.Engine) -> None:
    """Migrate, and add a row: what a seeding ``migrate`` (the dispatcher's demo catalog) does."""
    upgrade(engine)
    with session(engine) as s:
        rotate(s, Settings(_env_file=None, key_store_path=None))
        s.commit()


def test_the_rows_migrate_added_are_there_each_time_and_only_they(postgres_url: str, tmp_path: Path) -> None:
    for _ in range(2):
        with migrated_schema(postgres_url, _with_a_key) as url:
            assert _keys(url) == 1, "the seeded key, and not the one the last use added"
            assert _keys(url) == 2
    copy = migrated_sqlite(tmp_path / "copy.sqlite3", _with_a_key)
    assert _keys(copy) == 1
