"""The time every table and process uses: timezone-aware UTC, in Python and in both databases."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

__all__ = ["UtcDateTime", "utcnow"]


def utcnow() -> datetime:
    return datetime.now(UTC)


class UtcDateTime(sa.TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, on SQLite (which stores them naive) and PostgreSQL alike."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
