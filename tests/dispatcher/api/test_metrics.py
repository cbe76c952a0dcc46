"""``GET /metrics``: Prometheus text that Prometheus's own parser reads, with the series the
on-call engineer needs, computed from the database; admin token required unless opened."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from tests.dispatcher.conftest import ADMIN, MakeClient
from tests.dispatcher.support import assert_problem
from tests.schemas.samples import sample
from usp_core import db
from usp_core.clock import utcnow
from usp_schemas import new_event_id
from usp_workers.engine.outbox import emit
from usp_workers.operations import DELETED, replay_event
from usp_workers.storage.models import (
    Attempt,
    BreakerState,
    Delivery,
    Ordering,
    Subscription,
    SubscriptionState,
)

_deliveries = SQLModel.metadata.tables[Delivery.__tablename__]
_attempts = SQLModel.metadata.tables[Attempt.__tablename__]


def samples(text: str) -> dict[str, list[Sample]]:
    """Every sample of the exposition, by sample name (parsed by prometheus_client)."""
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for item in family.samples:
            found.setdefault(item.name, []).append(item)
    return found


def value(found: dict[str, list[Sample]], name: str, **labels: str) -> float:
    [match] = [s for s in found[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return match.value


def populate(engine: Engine) -> tuple[str, str]:
    """Two subscriptions (one with an open breaker) and deliveries in every state."""
    with db.session(engine) as s:
        healthy = Subscription(url="http://127.0.0.1:9/ok")
        broken = Subscription(
            url="http://127.0.0.1:9/broken?token=do-not-leak",
            breaker_state=BreakerState.OPEN,
            breaker_until=utcnow() + timedelta(minutes=5),
            consecutive_failures=12,
        )
        s.add(healthy)
        s.add(broken)
        s.commit()
        for _ in range(3):
            body = sample("booking.confirmed") | {"event_id": new_event_id()}
            emit(s, body)
        body = sample("booking.cancelled") | {"event_id": new_event_id()}
        emit(s, body)
        s.commit()
    now = utcnow()
    with engine.begin() as connection:
        ids = list(connection.execute(sa.select(_deliveries.c.id).order_by(_deliveries.c.id)).scalars())
        assert len(ids) == 8
        succeeded, dead, later, overdue = ids[:4], ids[4:5], ids[5:6], ids[6:8]
        connection.execute(
            sa.update(_deliveries).where(_deliveries.c.id.in_(succeeded)).values(status="succeeded")
        )
        connection.execute(sa.update(_deliveries).where(_deliveries.c.id.in_(dead)).values(status="dead"))
        connection.execute(
            sa.update(_deliveries)
            .where(_deliveries.c.id.in_(later))
            .values(next_attempt_at=now + timedelta(hours=1))
        )
        connection.execute(
            sa.update(_deliveries)
            .where(_deliveries.c.id.in_(overdue))
            .values(next_attempt_at=now - timedelta(seconds=90))
        )
        for delivery_id, ms, outcome, started in [
            (succeeded[0], 3.0, "succeeded", now),
            (succeeded[1], 40.0, "succeeded", now),
            (succeeded[2], 700.0, "succeeded", now),
            (dead[0], 5000.0, "dead", now),
            (succeeded[3], 1.0, "succeeded", now - timedelta(hours=1)),  # outside the window
        ]:
            connection.execute(
                sa.insert(_attempts).values(
                    delivery_id=delivery_id,
                    attempt_number=1,
                    started_at=started,
                    duration_ms=ms,
                    status_code=200 if outcome == "succeeded" else 500,
                    outcome=outcome,
                )
            )
    return healthy.id, broken.id


def test_metrics_need_the_admin_token_by_default(make_client: MakeClient) -> None:
    client = make_client()
    assert_problem(client.get("/metrics"), 401, "unauthenticated")
    assert_problem(client.get("/metrics", headers={"Authorization": "Bearer wrong"}), 401, "invalid_token")
    assert client.get("/metrics", headers=ADMIN).status_code == 200


def test_metrics_can_be_opened_for_a_private_network(make_client: MakeClient) -> None:
    response = make_client(metrics_public=True).get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")


def test_the_exposition_parses_and_carries_the_named_series(make_client: MakeClient, engine: Engine) -> None:
    client = make_client()  # migrates the database
    healthy, broken = populate(engine)

    response = client.get("/metrics", headers=ADMIN)

    assert response.status_code == 200
    assert "do-not-leak" not in response.text
    found = samples(response.text)
    confirmed, cancelled = "booking.confirmed", "booking.cancelled"
    total = sum(s.value for s in found["usp_deliveries"])
    assert total == 8
    assert sum(s.value for s in found["usp_deliveries"] if s.labels["event_type"] == cancelled) == 2
    assert sum(s.value for s in found["usp_deliveries"] if s.labels["event_type"] == confirmed) == 6
    assert sum(s.value for s in found["usp_deliveries"] if s.labels["status"] == "succeeded") == 4
    assert value(found, "usp_dead_letter_size") == 1
    assert value(found, "usp_queue_depth", state="due") == 2
    assert value(found, "usp_queue_depth", state="scheduled") == 1
    assert value(found, "usp_queue_depth", state="in_flight") == 0
    assert 85 <= value(found, "usp_oldest_due_delivery_age_seconds") < 600
    assert value(found, "usp_oldest_pending_delivery_age_seconds") >= 0
    # The latency histogram holds the four attempts inside the window, by outcome.
    assert value(found, "usp_attempt_duration_seconds_count", outcome="succeeded") == 3
    assert value(found, "usp_attempt_duration_seconds_count", outcome="dead") == 1
    assert value(found, "usp_attempt_duration_seconds_bucket", outcome="succeeded", le="0.005") == 1
    assert value(found, "usp_attempt_duration_seconds_bucket", outcome="succeeded", le="0.05") == 2
    assert value(found, "usp_attempt_duration_seconds_bucket", outcome="succeeded", le="1.0") == 3
    assert value(found, "usp_attempt_duration_seconds_bucket", outcome="dead", le="2.5") == 0
    assert value(found, "usp_attempt_duration_seconds_bucket", outcome="dead", le="+Inf") == 1
    assert abs(value(found, "usp_attempt_duration_seconds_sum", outcome="succeeded") - 0.743) < 1e-6
    # Breaker state per subscription, one-hot.
    assert value(found, "usp_subscription_breaker_state", subscription_id=broken, state="open") == 1
    assert value(found, "usp_subscription_breaker_state", subscription_id=broken, state="closed") == 0
    assert value(found, "usp_subscription_breaker_state", subscription_id=healthy, state="closed") == 1
    assert value(found, "usp_subscription_consecutive_failures", subscription_id=broken) == 12
    assert value(found, "usp_subscription_active", subscription_id=healthy) == 1


def test_deleted_subscriptions_leave_the_per_subscription_series(
    make_client: MakeClient, engine: Engine
) -> None:
    """Platforms create and delete subscriptions at will, and a deleted one keeps its row (its
    deliveries' history): were it exported, each create/delete cycle would add series for good
    (unbounded label cardinality). Disabled ones stay: an operator watches those."""
    client = make_client()
    with db.session(engine) as s:
        gone = Subscription(
            url="http://127.0.0.1:9/gone", state=SubscriptionState.DISABLED, disabled_reason=DELETED
        )
        paused = Subscription(
            url="http://127.0.0.1:9/paused", state=SubscriptionState.DISABLED, disabled_reason="410"
        )
        s.add(gone)
        s.add(paused)
        s.commit()
        gone_id, paused_id = gone.id, paused.id

    found = samples(client.get("/metrics", headers=ADMIN).text)

    for name in (
        "usp_subscription_breaker_state",
        "usp_subscription_consecutive_failures",
        "usp_subscription_active",
    ):
        assert [s for s in found[name] if s.labels["subscription_id"] == gone_id] == []
    assert value(found, "usp_subscription_active", subscription_id=paused_id) == 0


def test_a_redriven_dead_delivery_leaves_the_dead_letter_size(
    make_client: MakeClient, engine: Engine
) -> None:
    """A redrive (or replay) leaves the dead row dead and adds a newer delivery; once that one
    exists the dead letter no longer holds the event for that subscription (a redrive would not
    take it again), so the alarm series must drop, not wait 30 days for retention."""
    client = make_client()
    with db.session(engine) as s:
        s.add(Subscription(url="http://127.0.0.1:9/ok"))
        s.commit()
        record = emit(s, sample("booking.confirmed") | {"event_id": new_event_id()})
        s.commit()
        event_id = record.id
    with engine.begin() as connection:
        connection.execute(sa.update(_deliveries).values(status="dead"))
    found = samples(client.get("/metrics", headers=ADMIN).text)
    assert value(found, "usp_dead_letter_size") == 1

    with db.session(engine) as s:
        replay_event(s, event_id)
    with engine.begin() as connection:
        connection.execute(
            sa.update(_deliveries).where(_deliveries.c.status == "pending").values(status="succeeded")
        )

    found = samples(client.get("/metrics", headers=ADMIN).text)
    assert value(found, "usp_dead_letter_size") == 0
    assert value(found, "usp_deliveries", status="superseded", event_type="booking.confirmed") == 1
    assert not [s for s in found["usp_deliveries"] if s.labels["status"] == "dead"], "both series agree"


def test_a_subject_blocked_by_a_dead_delivery_shows_in_the_metrics_and_the_admin_api(
    make_client: MakeClient, engine: Engine
) -> None:
    """An ordered subscription's poison event: the gauge counts its subject, the admin API names
    it with what waits behind it; an unordered subscription's dead delivery blocks nothing."""
    client = make_client()
    with db.session(engine) as s:
        ordered = Subscription(url="http://127.0.0.1:9/ordered", ordering=Ordering.SUBJECT)
        unordered = Subscription(url="http://127.0.0.1:9/unordered")
        s.add(ordered)
        s.add(unordered)
        s.commit()
        events = [emit(s, sample("booking.confirmed") | {"event_id": new_event_id()}).id for _ in range(3)]
        s.commit()
        ordered_id, unordered_id = ordered.id, unordered.id
    with engine.begin() as connection:
        first = _deliveries.c.event_id == events[0]
        connection.execute(sa.update(_deliveries).where(first).values(status="dead", completed_at=utcnow()))

    found = samples(client.get("/metrics", headers=ADMIN).text)
    # The ordered subscription's two later deliveries are held, not due: no worker could send them.
    assert value(found, "usp_queue_depth", state="held") == 2
    assert value(found, "usp_queue_depth", state="due") == 2  # the unordered subscription's
    assert value(found, "usp_subjects_blocked", subscription_id=ordered_id) == 1
    assert value(found, "usp_subjects_blocked", subscription_id=unordered_id) == 0
    answer = client.get(f"/admin/subscriptions/{ordered_id}/blocked-subjects", headers=ADMIN)
    assert answer.status_code == 200, answer.text
    [blocked] = answer.json()["items"]
    booking_id = sample("booking.confirmed")["booking_id"]
    assert (blocked["subject"], blocked["event_id"], blocked["waiting"]) == (booking_id, events[0], 2)
    assert client.get(f"/admin/subscriptions/{unordered_id}/blocked-subjects", headers=ADMIN).json() == {
        "items": []
    }
    assert_problem(
        client.get("/admin/subscriptions/sub_nope/blocked-subjects", headers=ADMIN),
        404,
        "subscription_not_found",
    )
