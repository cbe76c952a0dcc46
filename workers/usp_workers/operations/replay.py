"""Replay: a new delivery of an event to each subscription it reaches, history untouched."""

from __future__ import annotations

import json
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Session

from usp_core.clock import utcnow
from usp_core.ids import new_id
from usp_workers.engine.ordering import subject_of
from usp_workers.engine.outbox import _enqueue_after_commit, event_matches, new_delivery_row, reaches, refusal
from usp_workers.operations.errors import Conflict, NotFound
from usp_workers.operations.query import _deliveries, _subscription, _subscriptions
from usp_workers.operations.views import Clock, Replayed
from usp_workers.storage.models import DeliveryStatus, EventRecord, Subscription, SubscriptionState


def replay_event(
    session: Session, event_id: str, *, subscription_id: str | None = None, now: Clock = utcnow
) -> Replayed:
    """Deliver ``event_id`` again, as new deliveries, to one subscription or to every active one
    it matches and reaches; commit, then hand the new deliveries to the broker.

    With ``subscription_id`` the subscription must be active, subscribed to the event's type and
    reached by its audience (:class:`Conflict` otherwise: replaying a platform's booking to
    another platform would leak it). Without, a replay that finds no target creates nothing.
    """
    # FOR KEY SHARE (PostgreSQL): retention, which locks the events it prunes FOR UPDATE SKIP
    # LOCKED, then skips this one; if retention holds it already, this waits for the prune and
    # finds no event (404) instead of failing the INSERT below on the foreign key (a 500).
    record = session.get(EventRecord, event_id, with_for_update={"key_share": True}, populate_existing=True)
    if record is None:
        raise _no_event_to_replay(event_id)
    if subscription_id is not None:
        subscription = _subscription(session, subscription_id)
        _check_target(subscription, record)
        targets = [(subscription.id, subscription.ordering)]
    else:
        rows = session.connection().execute(
            sa.select(
                _subscriptions.c.id,
                _subscriptions.c.event_types,
                _subscriptions.c.platform_profile,
                _subscriptions.c.ordering,
                _subscriptions.c.payload_filter,
            )
            .where(_subscriptions.c.state == SubscriptionState.ACTIVE.value)
            .order_by(_subscriptions.c.id)
        )
        targets = [(row.id, row.ordering) for row in rows if refusal(record, row) is None]
    moment = now()
    created = [(new_id("dlv"), target) for target, _ in targets]
    if created:
        subjects = [
            subject_of(ordering, record.subject_id, record.created_at, record.id) for _, ordering in targets
        ]
        try:
            session.connection().execute(
                sa.insert(_deliveries),
                # As emit's: marked handed off now; the relay re-sends only if the hand-off is lost.
                [
                    new_delivery_row(did, event_id, sid, moment, enqueued_at=moment, subject=subject)
                    for (did, sid), subject in zip(created, subjects, strict=True)
                ],
            )
            _supersede(session.connection(), [(did, event_id, sid) for did, sid in created], moment)
        except sa.exc.IntegrityError:
            # SQLite has no row lock to hold retention off: it pruned the event since we read it.
            session.rollback()
            if session.get(EventRecord, event_id) is None:
                raise _no_event_to_replay(event_id) from None
            raise
        _enqueue_after_commit(session, [did for did, _ in created])
    session.commit()
    return Replayed(event_id, created)


def _supersede(connection: sa.Connection, created: list[tuple[str, str, str]], moment: datetime) -> None:
    """Mark the dead deliveries of each new delivery's (event, subscription) as superseded by it,
    so that the dead letter, the metrics and the subscription counts stop counting them."""
    connection.execute(
        sa.update(_deliveries)
        .where(
            _deliveries.c.event_id == sa.bindparam("e"),
            _deliveries.c.subscription_id == sa.bindparam("s"),
            _deliveries.c.status == DeliveryStatus.DEAD.value,
        )
        .values(status=DeliveryStatus.SUPERSEDED.value, superseded_by=sa.bindparam("by"), updated_at=moment),
        [{"by": new, "e": event, "s": subscription} for new, event, subscription in created],
    )


def _no_event_to_replay(event_id: str) -> NotFound:
    return NotFound(
        "event_not_found",
        f"no event {event_id!r} is stored: it never reached this service, or it was older than the "
        "retention (USP_RETENTION_DAYS) and has been pruned; a pruned event cannot be replayed",
    )


def _check_target(subscription: Subscription, record: EventRecord) -> None:
    if subscription.state != SubscriptionState.ACTIVE:
        raise Conflict(
            "subscription_disabled", f"subscription {subscription.id!r} is disabled: enable it first"
        )
    if not event_matches(record.event_type, json.loads(subscription.event_types)):
        raise Conflict(
            "event_type_not_subscribed",
            f"subscription {subscription.id!r} is not subscribed to {record.event_type}",
        )
    if not reaches(subscription.platform_profile, record.audience):
        raise Conflict(
            "audience_mismatch",
            f"event {record.id} is not for subscription {subscription.id!r}'s platform",
        )
    why = refusal(record, subscription)
    if why is not None:
        raise Conflict(
            "filtered_out", f"subscription {subscription.id!r} does not take event {record.id}: {why}"
        )
