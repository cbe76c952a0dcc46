"""Helpers for the delivery engine's tests: a controllable clock, per-test endpoints, rows."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.db import session
from usp_workers.models import Attempt, Delivery, Subscription, Transport, utcnow
from usp_workers.outbox import emit

from .endpoints import App, Hub


class Clock:
    """``utcnow`` shifted by an offset the test moves forward (no sleeping for retries); or
    frozen at one moment when a test compares computed times exactly."""

    def __init__(self) -> None:
        self.offset = timedelta(0)
        self.frozen: datetime | None = None

    def __call__(self) -> datetime:
        return self.frozen if self.frozen is not None else utcnow() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)
        if self.frozen is not None:
            self.frozen += timedelta(seconds=seconds)

    def advance_to(self, moment: datetime) -> None:
        """Move on until ``moment`` has passed."""
        gap = (moment - self()).total_seconds()
        if gap >= 0:
            self.advance(gap + 0.001)

    def freeze(self) -> datetime:
        self.frozen = self()
        return self.frozen


class Endpoints:
    """Registers apps on the hub under paths unique to one test; removes them afterwards."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.prefix = f"/t/{uuid.uuid4().hex[:12]}"
        self.paths: list[str] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.hub.port}"

    def add(self, name: str, app: App) -> str:
        """Serve ``app`` at a fresh path; return its URL."""
        path = f"{self.prefix}/{name}"
        self.hub.routes[path] = app
        self.paths.append(path)
        return self.base + path

    def path(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def close(self) -> None:
        for path in self.paths:
            self.hub.routes.pop(path, None)


# -- rows ----------------------------------------------------------------------------------------


def add_subscription(engine: Engine, url: str, transport: Transport = Transport.REST) -> Subscription:
    with session(engine) as s:
        subscription = Subscription(url=url, transport=transport)
        s.add(subscription)
        s.commit()
        return subscription


def emit_event(engine: Engine, event_id: str | None = None) -> tuple[str, list[str]]:
    """Emit a fresh booking.confirmed event through the outbox; its id and its delivery ids."""
    event = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event["event_id"] = event_id or new_event_id()
    event["timestamp"] = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    with session(engine) as s:
        record = emit(s, event)
        s.commit()
        ids = list(s.exec(select(Delivery.id).where(Delivery.event_id == record.id)).all())
    return record.id, ids


def delivery(engine: Engine, delivery_id: str) -> Delivery:
    with Session(engine) as s:
        row = s.get(Delivery, delivery_id)
        assert row is not None
        s.expunge(row)
        return row


def attempts(engine: Engine, delivery_id: str) -> list[Attempt]:
    with Session(engine) as s:
        rows = s.exec(
            select(Attempt).where(Attempt.delivery_id == delivery_id).order_by(col(Attempt.id))
        ).all()
        for row in rows:
            s.expunge(row)
        return list(rows)


def subscription(engine: Engine, subscription_id: str) -> Subscription:
    with Session(engine) as s:
        row = s.get(Subscription, subscription_id)
        assert row is not None
        s.expunge(row)
        return row
