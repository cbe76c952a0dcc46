"""The waitlist: buyers waiting for a seat, offered one when a booking gives it back.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.waitlist``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from usp_core import db
from usp_core.clock import utcnow
from usp_dispatcher.scheduling.catalog import find_service
from usp_dispatcher.scheduling.events import emit_availability_changed, emit_waitlist_event
from usp_dispatcher.scheduling.outcomes import (
    Outcome,
    invalid_state_transition,
    service_not_found,
    waitlist_closed,
    waitlist_entry_not_found,
    waitlist_limit_reached,
)
from usp_dispatcher.scheduling.seats import claim_hold, hold_free_seat, release_hold
from usp_dispatcher.scheduling.tables import ServiceRow, SlotRow, WaitlistRow, WaitlistStatus
from usp_dispatcher.scheduling.views import waitlist_view
from usp_schemas import (
    Buyer,
    TimeWindow,
    WaitlistEntry,
    WaitlistExpired,
    WaitlistJoined,
    WaitlistLeft,
    WaitlistOffered,
)

__all__ = [
    "MAX_OPEN_PER_PLATFORM",
    "OFFER_TTL",
    "claim_offer",
    "expire_offers",
    "get_waitlist_entry",
    "join_waitlist",
    "leave_waitlist",
    "live_offer_for",
    "pass_on_freed_seat",
    "reuse_freed_seat",
    "same_buyer",
    "waitlist_entry_platform",
]

#: How long an offered seat is held for the buyer (never past the slot's start).
OFFER_TTL = timedelta(minutes=15)
#: Open entries one platform profile may hold at once (the business's own are not counted).
MAX_OPEN_PER_PLATFORM = 500
_OPEN = (WaitlistStatus.JOINED, WaitlistStatus.OFFERED)
_LIMIT_LOCK = "usp.waitlist_limit:"


def join_waitlist(
    session: Session,
    service_id: str,
    desired_window: TimeWindow,
    buyer: Buyer,
    *,
    correlation_id: str | None = None,
    platform_profile: str | None = None,
    now: datetime | None = None,
    max_open: int = MAX_OPEN_PER_PLATFORM,
) -> WaitlistEntry | Outcome:
    """Put ``buyer`` on the service's waitlist for a seat inside ``desired_window``
    (``usp_waitlist_join``), on behalf of ``platform_profile`` (``None``: the business).
    ``waitlist_closed`` when the window has already ended; ``waitlist_limit_reached`` when the
    platform already holds ``max_open`` open entries."""
    now = now or utcnow()
    service = find_service(session, service_id)
    if service is None:
        return service_not_found(service_id)
    if desired_window.end <= now:
        return waitlist_closed("the desired window has already ended")
    if platform_profile is not None and _open_entries(session, platform_profile) >= max_open:
        return waitlist_limit_reached(max_open)
    entry = WaitlistRow(
        service_id=service.id,
        window_start=desired_window.start,
        window_end=desired_window.end,
        buyer=buyer.model_dump_json(),
        correlation_id=correlation_id,
        platform_profile=platform_profile,
        created_at=now,
        updated_at=now,
    )
    session.add(entry)
    session.flush()
    entry = _reload(session, entry.id)
    emit_waitlist_event(session, WaitlistJoined, entry, service, now=now, correlation_id=correlation_id)
    return waitlist_view(entry, service)


def _open_entries(session: Session, platform_profile: str) -> int:
    db.lock_for_count(session, _LIMIT_LOCK + platform_profile, WaitlistRow)
    statement = (
        select(sa.func.count())
        .select_from(WaitlistRow)
        .where(col(WaitlistRow.platform_profile) == platform_profile)
        .where(col(WaitlistRow.state).in_(_OPEN))
    )
    return int(session.exec(statement).one())


def get_waitlist_entry(session: Session, entry_id: str) -> WaitlistEntry | Outcome:
    """The entry as it is now."""
    entry = session.get(WaitlistRow, entry_id)
    if entry is None:
        return waitlist_entry_not_found(entry_id)
    return waitlist_view(entry, _service(session, entry))


def waitlist_entry_platform(session: Session, entry_id: str) -> tuple[bool, str | None]:
    """Whether the entry exists, and the profile of the platform that owns it (``None``: the
    business); as :func:`usp_dispatcher.scheduling.bookings.booking_platform` is for bookings."""
    row = session.exec(
        select(WaitlistRow.id, WaitlistRow.platform_profile).where(col(WaitlistRow.id) == entry_id)
    ).first()
    return (False, None) if row is None else (True, row[1])


def leave_waitlist(
    session: Session, entry_id: str, *, correlation_id: str | None = None, now: datetime | None = None
) -> WaitlistEntry | Outcome:
    """Take the entry off the waitlist (``usp_waitlist_leave``); a seat held for it goes to the
    next buyer in line. ``invalid_state_transition`` once it was converted, expired or left."""
    now = now or utcnow()
    for _ in range(3):  # the entry may move under us (an offer made, an offer expiring): re-read
        entry = session.get(WaitlistRow, entry_id, populate_existing=True)
        if entry is None:
            return waitlist_entry_not_found(entry_id)
        observed = WaitlistStatus(entry.state)
        if observed not in _OPEN:
            return invalid_state_transition("waitlist entry", observed.value, "left")
        if not _move(
            session, entry_id, (col(WaitlistRow.state) == observed,), now, state=WaitlistStatus.LEFT
        ):
            continue
        entry = _reload(session, entry_id)
        service = _service(session, entry)
        emit_waitlist_event(session, WaitlistLeft, entry, service, now=now, correlation_id=correlation_id)
        if observed is WaitlistStatus.OFFERED and entry.offered_slot_id is not None:
            slot = release_hold(session, entry.offered_slot_id, now)
            emit_availability_changed(
                session, service, reuse_freed_seat(session, service, slot, now=now), now=now
            )
        return waitlist_view(entry, service)
    raise RuntimeError(f"waitlist entry {entry_id} kept changing while leaving it")


def reuse_freed_seat(session: Session, service: ServiceRow, slot: SlotRow, *, now: datetime) -> list[SlotRow]:
    """A seat of ``slot`` was just freed (in this transaction): offer it to the next buyer in line
    (:func:`pass_on_freed_seat`), or else it is back on sale. Returns the slots whose availability
    changed, for the caller's ``catalog.availability.changed`` (empty when the seat was offered,
    or the slot has started and is on sale to no one)."""
    if pass_on_freed_seat(session, service, slot, now=now) or slot.start <= now:
        return []
    return [slot]


def pass_on_freed_seat(session: Session, service: ServiceRow, slot: SlotRow, *, now: datetime) -> bool:
    """Offer a just-freed seat of ``slot`` to the oldest joined entry whose window contains the
    slot, holding the seat for it. Returns whether it was offered. A slot that has started is
    offered to no one.
    """
    if slot.start <= now:
        return False
    candidates = session.exec(
        select(WaitlistRow.id)
        .where(col(WaitlistRow.service_id) == slot.service_id)
        .where(col(WaitlistRow.state) == WaitlistStatus.JOINED)
        .where(col(WaitlistRow.window_start) <= slot.start)
        .where(col(WaitlistRow.window_end) >= slot.end)
        .order_by(col(WaitlistRow.created_at), col(WaitlistRow.id))
        .limit(20)
    ).all()
    expires = min(now + OFFER_TTL, slot.start)
    for entry_id in candidates:
        offered = _move(
            session,
            entry_id,
            (col(WaitlistRow.state) == WaitlistStatus.JOINED,),
            now,
            state=WaitlistStatus.OFFERED,
            offered_slot_id=slot.id,
            offer_expires_at=expires,
        )
        if not offered:
            continue  # left or expired since we looked: the next in line
        if hold_free_seat(session, slot.id, now) is None:
            # Cannot happen while this transaction holds the slot (the caller just wrote it).
            raise RuntimeError(f"slot {slot.id} has no free seat to hold for an offer")
        entry = _reload(session, entry_id)
        emit_waitlist_event(session, WaitlistOffered, entry, service, now=now, correlation_id=None)
        return True
    return False


def live_offer_for(
    session: Session, slot: SlotRow, buyer: Buyer, *, platform_profile: str | None = None, now: datetime
) -> WaitlistRow | None:
    """The unexpired offer of ``slot`` made to ``buyer`` (see :func:`same_buyer`), if any, among
    the entries of ``platform_profile`` (``None``: the business, who may take any entry's)."""
    statement = (
        select(WaitlistRow)
        .where(col(WaitlistRow.offered_slot_id) == slot.id)
        .where(col(WaitlistRow.state) == WaitlistStatus.OFFERED)
        .where(col(WaitlistRow.offer_expires_at) > now)
        .order_by(col(WaitlistRow.created_at))
    )
    if platform_profile is not None:
        statement = statement.where(col(WaitlistRow.platform_profile) == platform_profile)
    offers = session.exec(statement).all()
    return next((o for o in offers if same_buyer(Buyer.model_validate_json(o.buyer), buyer)), None)


def claim_offer(session: Session, entry: WaitlistRow, *, now: datetime) -> SlotRow | None:
    """Turn a live offer into a booked seat: the entry becomes ``converted`` (the caller sets its
    ``booking_id`` once the booking row exists, in this transaction) and its held seat booked.
    Returns the slot after the change; ``None`` when the offer lapsed or was left meanwhile."""
    claimed = _move(
        session,
        entry.id,
        (col(WaitlistRow.state) == WaitlistStatus.OFFERED, col(WaitlistRow.offer_expires_at) > now),
        now,
        state=WaitlistStatus.CONVERTED,
    )
    if not claimed or entry.offered_slot_id is None:
        return None
    return claim_hold(session, entry.offered_slot_id, now)


def expire_offers(session: Session, *, now: datetime | None = None, limit: int = 100) -> int:
    """Expire lapsed offers (their seats go to the next in line, or back on sale) and joined
    entries whose window has ended; ``waitlist.expired`` for each. Returns how many expired.

    For the scheduler, every few seconds; safe to run from several processes at once (each
    entry expires once). Handles at most ``limit`` entries of each kind per call.
    """
    now = now or utcnow()
    expired = 0
    lapsed = session.exec(
        select(WaitlistRow.id)
        .where(col(WaitlistRow.state) == WaitlistStatus.OFFERED)
        .where(col(WaitlistRow.offer_expires_at) <= now)
        .order_by(col(WaitlistRow.offer_expires_at))
        .limit(limit)
    ).all()
    for entry_id in lapsed:
        conditions = (
            col(WaitlistRow.state) == WaitlistStatus.OFFERED,
            col(WaitlistRow.offer_expires_at) <= now,
        )
        if not _move(session, entry_id, conditions, now, state=WaitlistStatus.EXPIRED):
            continue
        expired += 1
        entry = _reload(session, entry_id)
        service = _service(session, entry)
        emit_waitlist_event(session, WaitlistExpired, entry, service, now=now, correlation_id=None)
        if entry.offered_slot_id is not None:
            slot = release_hold(session, entry.offered_slot_id, now)
            emit_availability_changed(
                session, service, reuse_freed_seat(session, service, slot, now=now), now=now
            )
    ended = session.exec(
        select(WaitlistRow.id)
        .where(col(WaitlistRow.state) == WaitlistStatus.JOINED)
        .where(col(WaitlistRow.window_end) <= now)
        .order_by(col(WaitlistRow.window_end))
        .limit(limit)
    ).all()
    for entry_id in ended:
        conditions = (col(WaitlistRow.state) == WaitlistStatus.JOINED, col(WaitlistRow.window_end) <= now)
        if not _move(session, entry_id, conditions, now, state=WaitlistStatus.EXPIRED):
            continue
        expired += 1
        entry = _reload(session, entry_id)
        emit_waitlist_event(
            session, WaitlistExpired, entry, _service(session, entry), now=now, correlation_id=None
        )
    return expired


def same_buyer(offered_to: Buyer, buyer: Buyer) -> bool:
    """Whether ``buyer`` is the person an offer was made to, compared on the strongest identifier
    both have: e-mail (case-insensitive), else phone (digits only), else the name.

    >>> offered_to = Buyer(first_name="Al", email="AL@x.example")
    >>> same_buyer(offered_to, Buyer(first_name="Alice", email="al@x.example"))
    True
    """
    if offered_to.email and buyer.email:
        return offered_to.email.casefold() == buyer.email.casefold()
    if offered_to.phone and buyer.phone:
        return _digits(offered_to.phone) == _digits(buyer.phone)
    return (offered_to.first_name.casefold(), (offered_to.last_name or "").casefold()) == (
        buyer.first_name.casefold(),
        (buyer.last_name or "").casefold(),
    )


def _move(session: Session, entry_id: str, conditions: tuple[Any, ...], now: datetime, **values: Any) -> bool:
    statement = (
        sa.update(WaitlistRow)
        .where(col(WaitlistRow.id) == entry_id, *conditions)
        .values(updated_at=now, **values)
        .execution_options(synchronize_session=False)
    )
    return session.exec(statement).rowcount == 1


def _reload(session: Session, entry_id: str) -> WaitlistRow:
    entry = session.get(WaitlistRow, entry_id, populate_existing=True)
    if entry is None:
        raise RuntimeError(f"waitlist entry {entry_id} vanished inside its transaction")
    return entry


def _service(session: Session, entry: WaitlistRow) -> ServiceRow:
    service = session.get(ServiceRow, entry.service_id)
    if service is None:
        raise RuntimeError(f"waitlist entry {entry.id} names a missing service")
    return service


def _digits(phone: str) -> str:
    return "".join(ch for ch in phone if ch.isdigit())
