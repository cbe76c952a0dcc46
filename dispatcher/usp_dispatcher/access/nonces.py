"""Agents' signature nonces, remembered in the database so every API process refuses a replay.

A nonce is kept (hashed with the key's thumbprint) until a signature carrying it could no longer
be accepted; expired rows are swept now and then by the inserts themselves.
"""

from __future__ import annotations

import hashlib
import random
from datetime import UTC, datetime

import anyio.to_thread
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from usp_dispatcher.access.signatures import NonceCheck
from usp_dispatcher.domain.tables import NonceRow
from usp_workers.storage import db
from usp_workers.storage.models import utcnow

__all__ = ["database_nonces"]

_SWEEP_ONE_IN = 200
_table = NonceRow.__table__  # type: ignore[attr-defined]


def database_nonces(engine: Engine) -> NonceCheck:
    """A :data:`~.signatures.NonceCheck` over ``engine``'s ``access_nonces`` table."""

    async def check(thumbprint: str, nonce: str, keep_until: float) -> bool:
        return await anyio.to_thread.run_sync(_remember, engine, thumbprint, nonce, keep_until)

    return check


def _remember(engine: Engine, thumbprint: str, nonce: str, keep_until: float) -> bool:
    key = hashlib.sha256(f"{thumbprint}\n{nonce}".encode()).hexdigest()
    expires = datetime.fromtimestamp(keep_until, UTC)
    with db.session(engine) as session:
        if random.randrange(_SWEEP_ONE_IN) == 0:  # noqa: S311 - not a secret
            session.execute(sa.delete(_table).where(_table.c.expires_at < utcnow()))
        try:
            session.execute(sa.insert(_table).values(key=key, expires_at=expires))
            session.commit()
        except sa.exc.IntegrityError:
            session.rollback()
            return False
    return True
