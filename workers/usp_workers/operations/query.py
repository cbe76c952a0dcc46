"""What the listings share: opaque keyset cursors, pages, time ranges, and the statements that
read deliveries and attempts.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlmodel import Session, SQLModel

from usp_workers.operations.errors import InvalidRequest, NotFound
from usp_workers.operations.views import (
    AttemptView,
    DeadLetterFilter,
    DeliveryView,
    Page,
    _attempt_view,
    _delivery_view,
)
from usp_workers.storage.models import Attempt, Delivery, EventRecord, Job, Notice, Subscription

#: Largest page a list returns, whatever ``limit`` asks for.
MAX_PAGE = 200


_CURSOR_PREFIX = "v1:"


_MAX_CURSOR = 256


_events: sa.Table = SQLModel.metadata.tables[EventRecord.__tablename__]


_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]


_attempts: sa.Table = SQLModel.metadata.tables[Attempt.__tablename__]


_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]


_jobs: sa.Table = SQLModel.metadata.tables[Job.__tablename__]


_notices: sa.Table = SQLModel.metadata.tables[Notice.__tablename__]


_S = TypeVar("_S", bound="sa.Select[Any]")


def encode_cursor(last_id: str) -> str:
    """An opaque cursor for "the rows after ``last_id``".

    >>> decode_cursor(encode_cursor("evt_019a"))
    'evt_019a'
    """
    raw = (_CURSOR_PREFIX + last_id).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The id inside a cursor from :func:`encode_cursor`; :class:`InvalidRequest` otherwise."""
    if len(cursor) > _MAX_CURSOR:
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued") from None
    if not raw.startswith(_CURSOR_PREFIX) or len(raw) == len(_CURSOR_PREFIX):
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued")
    return raw.removeprefix(_CURSOR_PREFIX)


def _delivery_page(session: Session, statement: sa.Select[Any], limit: int) -> Page[DeliveryView]:
    """The deliveries ``statement`` selects (with their event type, ``limit + 1`` rows at most,
    newest first), each with its attempts, as a page."""
    rows = session.connection().execute(statement).all()
    more = len(rows) > limit
    rows = rows[:limit]
    attempts = _attempts_of(session.connection(), [row.id for row in rows])
    items = [_delivery_view(row, event_type=row.event_type, attempts=attempts.get(row.id)) for row in rows]
    return Page(items, encode_cursor(rows[-1].id) if more else None)


def _attempts_of(connection: sa.Connection, delivery_ids: list[str]) -> dict[str, list[AttemptView]]:
    """Every attempt of each delivery, in order."""
    attempts: dict[str, list[AttemptView]] = {}
    if delivery_ids:
        for row in connection.execute(
            sa.select(_attempts)
            .where(_attempts.c.delivery_id.in_(delivery_ids))
            .order_by(_attempts.c.delivery_id, _attempts.c.attempt_number, _attempts.c.id)
        ):
            attempts.setdefault(row.delivery_id, []).append(_attempt_view(row))
    return attempts


def _clamp(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE))


def _check_range(since: datetime | None, until: datetime | None) -> None:
    for moment in (since, until):
        if moment is not None and moment.tzinfo is None:
            raise InvalidRequest("invalid_time", "times must carry a UTC offset (e.g. 2026-03-14T22:00:00Z)")
    if since is not None and until is not None and until <= since:
        raise InvalidRequest("invalid_time_range", "until must be later than since")


def _in_range(
    statement: _S, column: sa.ColumnElement[Any], since: datetime | None, until: datetime | None
) -> _S:
    if since is not None:
        statement = statement.where(column >= since)
    if until is not None:
        statement = statement.where(column < until)
    return statement


def _dead_letter_filters(statement: _S, filters: DeadLetterFilter) -> _S:
    if filters.subscription_id is not None:
        statement = statement.where(_deliveries.c.subscription_id == filters.subscription_id)
    if filters.event_type is not None:
        statement = statement.where(_events.c.event_type == filters.event_type)
    return _in_range(statement, _events.c.created_at, filters.since, filters.until)


def _subscription(session: Session, subscription_id: str) -> Subscription:
    subscription = session.get(Subscription, subscription_id)
    if subscription is None:
        raise NotFound("subscription_not_found", f"no subscription {subscription_id!r}")
    return subscription


def _delivery_counts(session: Session, event_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    if not event_ids:
        return {}
    rows = session.connection().execute(
        sa.select(_deliveries.c.event_id, _deliveries.c.status, sa.func.count())
        .where(_deliveries.c.event_id.in_(list(event_ids)))
        .group_by(_deliveries.c.event_id, _deliveries.c.status)
    )
    counts: dict[str, dict[str, int]] = {}
    for event_id, status, count in rows:
        counts.setdefault(event_id, {})[status] = int(count)
    return counts


#: Which table an id's prefix names, for :func:`find_ids`.
_ID_TABLES: dict[str, sa.Table] = {
    "evt": _events,
    "sub": _subscriptions,
    "dlv": _deliveries,
    "job": _jobs,
}


def short_id(value: str | None) -> str:
    """``value`` as a table shows it (and :data:`SHORTENED_ID` reads it back).

    >>> short_id("dlv_01a2442ce15477f68ce1e1957203eef7")
    'dlv_…7203eef7'
    >>> short_id("evt_789abc")
    'evt_789abc'
    """
    if value is None:
        return "-"
    if len(value) <= 16:
        return value
    prefix, underscore, _ = value.partition("_")
    head = prefix + underscore if underscore and len(prefix) <= 6 else ""
    return f"{head}…{value[-8:]}"


#: An id as the CLI's tables print it (``evt_…7203eef7``), or typed with ``...``.
SHORTENED_ID = re.compile(r"([a-z]{3})_(?:…|\.\.\.)([0-9a-f]{4,32})")


def find_ids(session: Session, short: str, *, limit: int = 5) -> list[str]:
    """The full ids a shortened one (``evt_…7203eef7``, or with ``...``) stands for, oldest
    first, at most ``limit``: one is the answer, several say it is ambiguous. An id that is not
    shortened is returned as it is; a form that names no table is an :class:`InvalidRequest`.

    A suffix is no index lookup: the table is scanned, which an operator's command can afford
    (events are bounded by retention) and a hot path never asks for."""
    match = SHORTENED_ID.fullmatch(short)
    if match is None:
        if "…" in short or "..." in short:
            raise InvalidRequest("bad_id", f"{short!r} is not a shortened id such as evt_…7203eef7")
        return [short]
    table = _ID_TABLES.get(match.group(1))
    if table is None:
        raise InvalidRequest("bad_id", f"no kind of id starts with {match.group(1)!r}_")
    pattern = f"{match.group(1)}\\_%{match.group(2)}"
    found = session.connection().execute(
        sa.select(table.c.id).where(table.c.id.like(pattern, escape="\\")).order_by(table.c.id).limit(limit)
    )
    return list(found.scalars())
