"""The demo catalog: something to book on a fresh installation (``usp-webhooks up``).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.seed``.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from usp_core import db
from usp_core.clock import utcnow
from usp_dispatcher.scheduling.catalog import ServiceSpec, create_service
from usp_dispatcher.scheduling.tables import ServiceRow, SlotRow
from usp_dispatcher.scheduling.views import zone
from usp_schemas import Money

__all__ = ["DEMO_DAYS", "DEMO_SERVICES", "DEMO_TIMEZONE", "ensure_demo_catalog", "seed_demo_catalog"]

DEMO_TIMEZONE = "America/New_York"
#: Days of slots seeded, starting tomorrow.
DEMO_DAYS = 14


def _hours(first: int, last: int) -> tuple[time, ...]:
    return tuple(time(hour) for hour in range(first, last + 1))


#: (service, slot id tag, local start times each day).
DEMO_SERVICES: tuple[tuple[ServiceSpec, str, tuple[time, ...]], ...] = (
    (
        ServiceSpec(
            id="svc_haircut_001",
            name="Haircut",
            description="Wash, cut and style with one of our stylists.",
            duration_minutes=60,
            price=Money(amount=4500, currency="USD"),
            timezone=DEMO_TIMEZONE,
        ),
        "haircut",
        _hours(9, 16),
    ),
    (
        ServiceSpec(
            id="svc_colour_001",
            name="Hair colouring",
            description="Full colour, including a strand test.",
            duration_minutes=120,
            price=Money(amount=9500, currency="USD"),
            timezone=DEMO_TIMEZONE,
        ),
        "colour",
        (time(10), time(14)),
    ),
    (
        ServiceSpec(
            id="svc_consult_001",
            name="Style consultation",
            description="Fifteen minutes of advice before a bigger change; free.",
            duration_minutes=30,
            price=Money(amount=0, currency="USD"),
            timezone=DEMO_TIMEZONE,
        ),
        "consult",
        (time(9), time(9, 30), time(12), time(12, 30)),
    ),
    (
        ServiceSpec(
            id="svc_yoga_001",
            name="Group yoga class",
            description="An hour of yoga for all levels; mats provided.",
            duration_minutes=60,
            price=Money(amount=1500, currency="USD"),
            capacity=8,
            timezone=DEMO_TIMEZONE,
        ),
        "yoga",
        (time(18),),
    ),
)


def seed_demo_catalog(session: Session, *, now: datetime | None = None, days: int = DEMO_DAYS) -> int:
    """Add the demo services and their slots when the catalog has never had a service; returns
    how many services were added (0: nothing to do). The caller commits."""
    if session.exec(select(ServiceRow.id).limit(1)).first() is not None:
        return 0
    now = now or utcnow()
    local = zone(DEMO_TIMEZONE)
    today = now.astimezone(local).date()
    slots: list[dict[str, object]] = []
    for spec, tag, starts in DEMO_SERVICES:
        service = create_service(session, spec, now=now, announce=False)
        length = timedelta(minutes=spec.duration_minutes)
        for offset in range(1, days + 1):
            day = today + timedelta(days=offset)
            for start_time in starts:
                start = datetime.combine(day, start_time, local).astimezone(UTC)
                slots.append(
                    {
                        "id": f"slot_{tag}_{day:%Y%m%d}_{start_time:%H%M}",
                        "service_id": service.id,
                        "start": start,
                        "end": start + length,
                        "capacity": spec.capacity,
                        "booked": 0,
                        "held": 0,
                        "created_at": now,
                        "updated_at": now,
                    }
                )
    session.flush()  # the services first: the slots reference them
    # One multi-row INSERT: this runs at every start of a fresh installation (and test).
    session.exec(sa.insert(SlotRow), params=slots)
    return len(DEMO_SERVICES)


def ensure_demo_catalog(engine: Engine) -> int:
    """Seed and commit (the API's start-up); a concurrent seeder winning the race counts as done."""
    with db.session(engine) as session:
        try:
            added = seed_demo_catalog(session)
            session.commit()
        except sa.exc.IntegrityError:
            session.rollback()
            return 0
        return added
