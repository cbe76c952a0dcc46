"""The dispatcher's database schema: the delivery engine's migrations, then the domain's.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.database``.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine

# Each module's tables join the metadata as the module is imported.
from usp_core import db
from usp_dispatcher.access import tables as _access_tables  # noqa: F401
from usp_dispatcher.scheduling import tables as _scheduling_tables  # noqa: F401
from usp_dispatcher.tables import METADATA
from usp_dispatcher.ucap import tables as _content_tables  # noqa: F401
from usp_workers import upgrade as upgrade_engine

__all__ = ["METADATA", "MIGRATIONS", "upgrade"]

MIGRATIONS = Path(__file__).with_name("migrations")
VERSION_TABLE = "alembic_version_dispatcher"
_MIGRATION_LOCK = 0x5553_5044  # "USPD": not the engine's lock, so the two chains never wait on each other


def upgrade(engine: Engine, revision: str = "head") -> dict[str, db.Migrated]:
    """Bring both chains to their head (``revision`` applies to the domain's chain); what each
    did, by chain name (``engine``, ``domain``)."""
    engine_chain = upgrade_engine(engine)
    domain_chain = db.run_migrations(
        engine, MIGRATIONS, lock=_MIGRATION_LOCK, revision=revision, version_table=VERSION_TABLE
    )
    return {"engine": engine_chain, "domain": domain_chain}
