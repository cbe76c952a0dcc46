"""Principal → profile binding (USP §10.1.6): the first profile a principal presents is its own.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.access.bindings``.
"""

from __future__ import annotations

from typing import Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from usp_core.clock import utcnow
from usp_dispatcher.access.errors import forbidden
from usp_dispatcher.access.tables import PrincipalProfileRow

__all__ = ["MAX_PROFILE_LENGTH", "bind_profile", "bound_profile"]

MAX_PROFILE_LENGTH: Final = 2048


def bind_profile(session: Session, principal: str, profile: str) -> None:
    """Accept ``profile`` for ``principal``, recording it when it is the first; ``AccessError``
    (-32003) when the principal is bound to another profile.

    A first pairing is committed at once (with whatever else the session holds): a binding that
    could roll back with the call's business outcome would not bind anything.
    """
    bound = bound_profile(session, principal)
    if bound is None:
        _record(session, principal, profile)
        bound = bound_profile(session, principal)
    if bound != profile:
        raise forbidden(
            "this principal is bound to another platform profile: _meta.usp.profile must be the one "
            "it presented first"
        )


def bound_profile(session: Session, principal: str) -> str | None:
    """The profile ``principal`` is bound to, read from the database (not the session's cache)."""
    statement = sa.select(col(PrincipalProfileRow.profile)).where(
        col(PrincipalProfileRow.principal) == principal
    )
    profile: str | None = session.connection().execute(statement).scalar()
    return profile


def _record(session: Session, principal: str, profile: str) -> None:
    session.commit()  # end any read transaction first: SQLite cannot upgrade a stale snapshot
    values = {"principal": principal, "profile": profile, "created_at": utcnow()}
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        statement: sa.Insert = postgresql.insert(PrincipalProfileRow).values(values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        statement = sqlite.insert(PrincipalProfileRow).values(values).on_conflict_do_nothing()
    else:
        statement = sa.insert(PrincipalProfileRow).values(values)
    try:
        session.exec(statement)
        session.commit()
    except IntegrityError:  # another dialect, and someone else was first: their row decides
        session.rollback()
