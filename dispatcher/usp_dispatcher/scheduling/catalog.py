"""The catalog: services and their slots, what buyers browse before booking.

``list_catalog`` and ``query_availability`` are the public reads behind ``usp_catalog_list`` and
``usp_availability_query``. ``create_service`` and ``add_slot`` are how the business (and the
demo seed) fills the catalog; they emit ``catalog.service.created`` and
``catalog.availability.changed`` unless told the change is not news (``announce=False``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from sqlmodel import Session, col, select

from usp_core.clock import utcnow
from usp_core.ids import new_id
from usp_dispatcher.errors import InvalidRequest
from usp_dispatcher.scheduling.events import emit_availability_changed, emit_service_event
from usp_dispatcher.scheduling.outcomes import Outcome, service_not_found
from usp_dispatcher.scheduling.tables import ServiceRow, SlotRow
from usp_dispatcher.scheduling.views import service_view, slot_view, zone
from usp_schemas import Money, Service, ServiceCreated, Slot

__all__ = [
    "MAX_AVAILABILITY_DAYS",
    "Availability",
    "ServiceSpec",
    "add_slot",
    "create_service",
    "find_service",
    "list_catalog",
    "query_availability",
]

#: Longest span one availability query may cover, in days (both ends included).
MAX_AVAILABILITY_DAYS = 62


@dataclass(frozen=True, slots=True)
class Availability:
    """The bookable slots of a service between two dates of the business's calendar."""

    service_id: str
    start_date: date
    end_date: date
    slots: list[Slot]


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A service to add to the catalog. ``id`` defaults to a fresh ``svc_…``."""

    name: str
    duration_minutes: int
    description: str | None = None
    price: Money | None = None
    capacity: int = 1
    timezone: str = "UTC"
    id: str | None = None


def list_catalog(session: Session) -> list[Service]:
    """The active services, by name (``usp_catalog_list``)."""
    rows = session.exec(
        select(ServiceRow).where(col(ServiceRow.active)).order_by(col(ServiceRow.name), col(ServiceRow.id))
    ).all()
    return [service_view(row) for row in rows]


def query_availability(
    session: Session, service_id: str, start_date: date, end_date: date, *, now: datetime | None = None
) -> Availability | Outcome:
    """Slots with a free seat, starting from ``start_date`` through ``end_date`` (both included)
    in the service's time zone, soonest first (``usp_availability_query``).

    Raises :class:`InvalidRequest` when ``end_date`` is before ``start_date`` or the span is
    longer than :data:`MAX_AVAILABILITY_DAYS`.
    """
    now = now or utcnow()
    if end_date < start_date:
        raise InvalidRequest("end_date is before start_date")
    if (end_date - start_date).days + 1 > MAX_AVAILABILITY_DAYS:
        raise InvalidRequest(f"at most {MAX_AVAILABILITY_DAYS} days per availability query")
    service = find_service(session, service_id)
    if service is None:
        return service_not_found(service_id)
    local = zone(service.timezone)
    window_start = datetime.combine(start_date, time(), local)
    window_end = datetime.combine(end_date + timedelta(days=1), time(), local)
    rows = session.exec(
        select(SlotRow)
        .where(col(SlotRow.service_id) == service.id)
        .where(col(SlotRow.start) >= window_start)
        .where(col(SlotRow.start) < window_end)
        .where(col(SlotRow.start) > now)  # as take_seat: a slot starting now is no longer bookable
        .where(col(SlotRow.booked) + col(SlotRow.held) < col(SlotRow.capacity))
        .order_by(col(SlotRow.start), col(SlotRow.id))
    ).all()
    slots = [slot_view(row, service, now) for row in rows]
    return Availability(service.id, start_date, end_date, slots)


def find_service(session: Session, service_id: str) -> ServiceRow | None:
    """The service if it exists and is bookable (a retired service is, to buyers, not there)."""
    service = session.get(ServiceRow, service_id)
    return service if service is not None and service.active else None


def create_service(
    session: Session, spec: ServiceSpec, *, now: datetime | None = None, announce: bool = True
) -> Service:
    """Add a service (``catalog.service.created`` unless ``announce`` is false)."""
    now = now or utcnow()
    zone(spec.timezone)  # an unknown zone is logged now, not at the first booking
    row = ServiceRow(
        id=spec.id or new_id("svc"),
        name=spec.name,
        description=spec.description,
        duration_minutes=spec.duration_minutes,
        price_amount=spec.price.amount if spec.price else None,
        price_currency=spec.price.currency if spec.price else None,
        capacity=spec.capacity,
        timezone=spec.timezone,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    if announce:
        emit_service_event(session, ServiceCreated, row, now=now)
    return service_view(row)


def add_slot(
    session: Session,
    service_id: str,
    start: datetime,
    *,
    capacity: int | None = None,
    slot_id: str | None = None,
    now: datetime | None = None,
    announce: bool = True,
) -> Slot | Outcome:
    """Open a slot of the service's duration at ``start`` (an aware datetime) with ``capacity``
    seats (default: the service's); ``catalog.availability.changed`` unless ``announce`` is false."""
    now = now or utcnow()
    if start.tzinfo is None:
        raise InvalidRequest("start must be an aware datetime")
    service = find_service(session, service_id)
    if service is None:
        return service_not_found(service_id)
    row = SlotRow(
        id=slot_id or new_id("slot"),
        service_id=service.id,
        start=start,
        end=start + timedelta(minutes=service.duration_minutes),
        capacity=capacity if capacity is not None else service.capacity,
        created_at=now,
        updated_at=now,
    )
    session.add(row)
    if announce:
        emit_availability_changed(session, service, [row], now=now)
    return slot_view(row, service, now)
