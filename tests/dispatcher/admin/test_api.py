"""``/admin``: the token guard, listings with filters and cursors, replay, jobs, subscriptions.

The app runs with its lifespan (migrations, signing key, the broker hand-off installed) on SQLite
and PostgreSQL. No worker runs here: what the API stores and sends to the broker is checked; the
job a worker would run is run by calling the same engine function the ``usp.run_job`` task
calls. Deliveries reaching real receivers are shown in ``test_cli.py`` (a real worker) and
``tests/workers/operations/test_operations.py`` (the engine).
"""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from tests.dispatcher.conftest import ADMIN, MakeClient
from tests.dispatcher.support import assert_problem, event, subscribe
from usp_workers import operations
from usp_workers.engine import health
from usp_workers.runtime import tasks
from usp_workers.runtime.celery_app import QUEUE
from usp_workers.runtime.embedded_broker import make_broker_engine
from usp_workers.storage.models import Delivery, DeliveryStatus, EventRecord, Subscription, SubscriptionState

SINK = "http://127.0.0.1:9/webhooks"  # never called here: no worker runs in these tests


def post_event(client: TestClient, body: dict[str, Any]) -> str:
    response = client.post("/events", json=body, headers=ADMIN)
    assert response.status_code == 202, response.text
    return str(response.json()["event_id"])


def deliveries(engine: Engine, event_id: str) -> list[Delivery]:
    with Session(engine) as s:
        rows = list(s.exec(select(Delivery).where(Delivery.event_id == event_id).order_by(col(Delivery.id))))
        for row in rows:
            s.expunge(row)
        return rows


def broker_tasks(tmp_path: Path) -> list[tuple[str, Any]]:
    """(task name, first argument) of every message the app sent to the test's embedded broker."""
    engine = make_broker_engine(f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}")
    try:
        with engine.connect() as connection:
            payloads = connection.execute(sa.text("SELECT payload FROM kombu_message ORDER BY id")).scalars()
            messages = [json.loads(p) for p in payloads]
    finally:
        engine.dispose()
    return [
        (m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0][0])
        for m in messages
        if m["properties"]["delivery_info"]["routing_key"] == QUEUE
    ]


def walk(client: TestClient, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = None
    for _ in range(50):
        response = client.get(path, params=params | ({"cursor": cursor} if cursor else {}), headers=ADMIN)
        assert response.status_code == 200, response.text
        page = response.json()
        items.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            return items
    raise AssertionError("pagination never ended")


# -- the guard -------------------------------------------------------------------------------------


def test_every_admin_route_refuses_a_missing_or_wrong_token(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    routes = [
        (method.upper(), path.replace("{", "").replace("}", ""))
        for path, operations_ in paths.items()
        if path.startswith("/admin")
        for method in operations_
    ]
    assert len(routes) >= 13, routes
    assert ("PUT", "/admin/subscriptions/subscription_id/rate-limit") in routes
    assert {("GET", "/admin/keys"), ("POST", "/admin/keys/rotate")} <= set(routes)
    for method, path in routes:
        missing = client.request(method, path, json={})
        assert_problem(missing, 401, "unauthenticated")
        wrong = client.request(method, path, json={}, headers={"Authorization": "Bearer not-the-token"})
        assert_problem(wrong, 401, "invalid_token")
        assert "not-the-token" not in wrong.text


def test_openapi_documents_the_admin_answers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    detail = spec["paths"]["/admin/events/{event_id}"]["get"]["responses"]["200"]
    assert detail["content"]["application/json"]["schema"]["$ref"].endswith("/EventDetailOut")
    attempt = spec["components"]["schemas"]["AttemptOut"]["properties"]
    assert {"status_code", "duration_ms", "response_excerpt", "error_class", "outcome"} <= set(attempt)
    assert "AdminToken" in json.dumps(spec["paths"]["/admin/subscriptions"]["get"]["security"])
    replay = spec["paths"]["/admin/events/{event_id}/replay"]["post"]["responses"]
    assert {"202", "401", "404", "409", "422"} <= set(replay)
    assert replay["409"]["content"]["application/json"]["schema"]["$ref"].endswith("/ProblemOut")


# -- events -------------------------------------------------------------------------------------------


def test_events_are_listed_newest_first_with_filters_and_cursors(client: TestClient, engine: Engine) -> None:
    subscribe(client, SINK, ["booking.*"])
    ids = [
        post_event(client, event(kind, correlation_id=f"corr_{n % 3}"))
        for n, kind in enumerate(["booking.confirmed", "waitlist.joined", "booking.cancelled"] * 3)
    ]
    everything = walk(client, "/admin/events", {"limit": 2})
    assert [e["id"] for e in everything] == sorted(ids, reverse=True)
    assert everything[-1]["deliveries"] == {"pending": 1}

    def ids_for(**params: Any) -> list[str]:
        return [e["id"] for e in walk(client, "/admin/events", params | {"limit": 200})]

    assert ids_for(event_type="booking.cancelled") == sorted(ids[2::3], reverse=True)
    assert ids_for(correlation_id="corr_1") == sorted(ids[1::3], reverse=True)
    assert ids_for(subject_id="wl_01hx5k") == sorted(ids[1::3], reverse=True)
    assert set(ids_for(delivery_status="pending")) == set(ids) - set(ids[1::3])
    assert ids_for(delivery_status="dead") == []
    with engine.begin() as connection:
        connection.execute(
            sa.update(EventRecord)
            .where(col(EventRecord.id) == ids[0])
            .values(created_at=datetime.now(UTC) - timedelta(days=2))
        )
    since = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert ids_for(since=since) == sorted(ids[1:], reverse=True)
    assert ids_for(until=since) == [ids[0]]


@pytest.mark.parametrize(
    ("params", "reason"),
    [
        ({"cursor": "not-ours"}, "invalid_cursor"),
        ({"since": "2026-01-01T00:00:00"}, "invalid_time"),
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "invalid_time_range"),
        ({"delivery_status": "lost"}, "invalid_request"),
        ({"limit": 0}, "invalid_request"),
    ],
)
def test_bad_listing_parameters_are_problems(client: TestClient, params: dict[str, Any], reason: str) -> None:
    assert_problem(client.get("/admin/events", params=params, headers=ADMIN), 422, reason)


def test_one_event_shows_its_payload_and_deliveries(client: TestClient) -> None:
    subscription = subscribe(client, SINK)
    body = event("booking.confirmed")
    event_id = post_event(client, body)
    detail = client.get(f"/admin/events/{event_id}", headers=ADMIN).json()
    assert detail["payload"]["event_id"] == event_id
    assert detail["payload"]["booking_id"] == body["booking_id"]
    (delivery,) = detail["deliveries"]
    assert (delivery["subscription_id"], delivery["status"], delivery["attempts"]) == (
        subscription["id"],
        "pending",
        [],
    )
    assert_problem(client.get("/admin/events/evt_nope", headers=ADMIN), 404, "event_not_found")


# -- replay -----------------------------------------------------------------------------------------


def test_replay_to_all_to_one_and_back_fill_keep_history(
    client: TestClient, engine: Engine, tmp_path: Path
) -> None:
    first = subscribe(client, SINK)
    event_id = post_event(client, event("booking.confirmed"))
    (original,) = deliveries(engine, event_id)
    with engine.begin() as connection:
        connection.execute(
            sa.update(Delivery)
            .where(col(Delivery.id) == original.id)
            .values(status=DeliveryStatus.DEAD.value, attempt_count=8)
        )
    late = subscribe(client, SINK + "/late")  # created after the event: it never had it

    one = client.post(f"/admin/events/{event_id}/replay", json={"subscription_id": late["id"]}, headers=ADMIN)
    assert one.status_code == 202, one.text
    assert [d["subscription_id"] for d in one.json()["deliveries"]] == [late["id"]]
    everyone = client.post(f"/admin/events/{event_id}/replay", headers=ADMIN)
    assert everyone.status_code == 202, everyone.text
    assert sorted(d["subscription_id"] for d in everyone.json()["deliveries"]) == sorted(
        [first["id"], late["id"]]
    )

    rows = deliveries(engine, event_id)
    assert len(rows) == 4
    kept = next(r for r in rows if r.id == original.id)
    assert (kept.status, kept.attempt_count) == (DeliveryStatus.SUPERSEDED, 8), "history kept"
    new = [r.id for r in rows if r.id != original.id]
    assert kept.superseded_by in new, "the first replay to its subscription took its place"
    assert all(r.status == DeliveryStatus.PENDING for r in rows if r.id in new)
    assert tasks.flush_enqueuer(), "the API's hand-off publishes what it holds"
    handed = [arg for task, arg in broker_tasks(tmp_path) if task == "usp.deliver"]
    assert {i for batch in handed for i in batch} >= set(new), "handed to the broker after commit"


def test_replay_refusals_are_problems(client: TestClient, engine: Engine) -> None:
    waitlist_only = subscribe(client, SINK, ["waitlist.*"])
    disabled = subscribe(client, SINK + "/off")
    event_id = post_event(client, event("booking.confirmed"))
    assert client.post(f"/admin/subscriptions/{disabled['id']}/disable", headers=ADMIN).status_code == 200
    for target, status, reason in [
        (waitlist_only["id"], 409, "event_type_not_subscribed"),
        (disabled["id"], 409, "subscription_disabled"),
        ("sub_missing", 404, "subscription_not_found"),
    ]:
        response = client.post(
            f"/admin/events/{event_id}/replay", json={"subscription_id": target}, headers=ADMIN
        )
        assert_problem(response, status, reason)
    assert_problem(client.post("/admin/events/evt_nope/replay", headers=ADMIN), 404, "event_not_found")
    assert_problem(
        client.post(f"/admin/events/{event_id}/replay", json={"subscription": "x"}, headers=ADMIN),
        422,
        "invalid_request",
    )
    # Only emit's delivery (to the subscription disabled since): the refusals created nothing.
    assert [d.subscription_id for d in deliveries(engine, event_id)] == [disabled["id"]]


# -- jobs ----------------------------------------------------------------------------------------------


def test_recover_records_a_job_sends_it_to_the_workers_and_reports_progress(
    client: TestClient, engine: Engine, tmp_path: Path
) -> None:
    target = subscribe(client, SINK)
    other = subscribe(client, SINK + "/other")
    event_ids = [post_event(client, event("booking.confirmed")) for _ in range(3)]
    with engine.begin() as connection:
        connection.execute(
            sa.update(Delivery)
            .where(col(Delivery.subscription_id) == target["id"])
            .values(status=DeliveryStatus.DEAD.value, attempt_count=8)
        )
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    response = client.post(
        f"/admin/subscriptions/{target['id']}/recover", json={"since": since}, headers=ADMIN
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert (job["kind"], job["status"], job["total"], job["processed"]) == ("recover", "running", 3, 0)
    assert job["params"]["subscription_id"] == target["id"]
    assert ("usp.run_job", job["id"]) in broker_tasks(tmp_path)

    operations.run_job(engine, job["id"])  # what the worker's usp.run_job does
    done = client.get(f"/admin/jobs/{job['id']}", headers=ADMIN).json()
    assert (done["status"], done["processed"], done["total"]) == ("succeeded", 3, 3)
    assert done["finished_at"] is not None
    for event_id in event_ids:
        statuses = sorted((d.subscription_id, d.status) for d in deliveries(engine, event_id))
        assert statuses == sorted(
            [
                (target["id"], DeliveryStatus.PENDING),
                (target["id"], DeliveryStatus.SUPERSEDED),
                (other["id"], "pending"),
            ]
        )
    resumed = client.post(f"/admin/jobs/{job['id']}/resume", headers=ADMIN)
    assert resumed.json()["status"] == "succeeded"
    assert_problem(client.get("/admin/jobs/job_nope", headers=ADMIN), 404, "job_not_found")
    assert_problem(
        client.post("/admin/subscriptions/sub_nope/recover", json={"since": since}, headers=ADMIN),
        404,
        "subscription_not_found",
    )
    assert_problem(
        client.post(f"/admin/subscriptions/{target['id']}/recover", json={}, headers=ADMIN),
        422,
        "invalid_request",
    )


def test_dead_letter_lists_and_redrives_filtered(client: TestClient, engine: Engine, tmp_path: Path) -> None:
    first = subscribe(client, SINK)
    second = subscribe(client, SINK + "/2")
    confirmed = post_event(client, event("booking.confirmed"))
    cancelled = post_event(client, event("booking.cancelled"))
    with engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value, attempt_count=8))

    listed = walk(client, "/admin/dead-letter", {"limit": 3})
    assert len(listed) == 4
    assert {(d["event_id"], d["event_type"]) for d in listed} == {
        (confirmed, "booking.confirmed"),
        (cancelled, "booking.cancelled"),
    }
    mine = walk(
        client, "/admin/dead-letter", {"subscription_id": second["id"], "event_type": "booking.cancelled"}
    )
    assert [(d["subscription_id"], d["event_id"]) for d in mine] == [(second["id"], cancelled)]

    response = client.post(
        "/admin/dead-letter/redrive", json={"subscription_id": second["id"]}, headers=ADMIN
    )
    assert response.status_code == 202, response.text
    job = response.json()
    assert (job["kind"], job["total"]) == ("redrive", 2)
    operations.run_job(engine, job["id"])
    pending = {
        (d.subscription_id, d.event_id)
        for e in (confirmed, cancelled)
        for d in deliveries(engine, e)
        if d.status == "pending"
    }
    assert pending == {(second["id"], confirmed), (second["id"], cancelled)}

    everything = client.post("/admin/dead-letter/redrive", headers=ADMIN).json()
    assert everything["total"] == 2, "only the first subscription's are still the latest and dead"
    operations.run_job(engine, everything["id"])
    latest = {
        (d.subscription_id, d.event_id): d.status
        for e in (confirmed, cancelled)
        for d in deliveries(engine, e)
    }
    assert set(latest.values()) == {"pending"}, "each (subscription, event) now ends in a new delivery"
    assert {s for s, _ in latest} == {first["id"], second["id"]}


def test_every_view_of_the_dead_letter_agrees_before_and_after_a_redrive(
    client: TestClient, engine: Engine
) -> None:
    """The dead-letter list, the events filter, the subscriptions' counts and /metrics count the
    same deliveries; a redriven one leaves all four at once (superseded, naming its successor)."""
    subscribe(client, SINK)
    event_ids = [post_event(client, event("booking.confirmed")) for _ in range(2)]
    with engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value, attempt_count=8))

    def views() -> dict[str, object]:
        metrics = client.get("/metrics", headers=ADMIN).text
        dead_series = [
            float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("usp_deliveries{") and 'status="dead"' in line
        ]
        (size,) = [line for line in metrics.splitlines() if line.startswith("usp_dead_letter_size ")]
        (health,) = walk(client, "/admin/subscriptions", {})
        return {
            "dead-letter": sorted(d["event_id"] for d in walk(client, "/admin/dead-letter", {})),
            "events": sorted(e["id"] for e in walk(client, "/admin/events", {"delivery_status": "dead"})),
            "subscriptions": health["dead"],
            "metrics size": float(size.rsplit(" ", 1)[1]),
            "metrics series": sum(dead_series),
        }

    assert views() == {
        "dead-letter": sorted(event_ids),
        "events": sorted(event_ids),
        "subscriptions": 2,
        "metrics size": 2.0,
        "metrics series": 2.0,
    }
    job = client.post("/admin/dead-letter/redrive", headers=ADMIN).json()
    operations.run_job(engine, job["id"])
    assert views() == {
        "dead-letter": [],
        "events": [],
        "subscriptions": 0,
        "metrics size": 0.0,
        "metrics series": 0.0,
    }
    for event_id in event_ids:
        old, new = deliveries(engine, event_id)
        assert (old.status, old.superseded_by, new.status) == (DeliveryStatus.SUPERSEDED, new.id, "pending")
        detail = client.get(f"/admin/events/{event_id}", headers=ADMIN).json()
        assert [d["superseded_by"] for d in detail["deliveries"]] == [new.id, None]
    superseded = walk(client, "/admin/events", {"delivery_status": "superseded"})
    assert sorted(e["id"] for e in superseded) == sorted(event_ids)


# -- subscriptions ------------------------------------------------------------------------------------


def test_subscriptions_with_health_disable_and_enable(client: TestClient, engine: Engine) -> None:
    created = [subscribe(client, f"{SINK}/{n}") for n in range(3)]
    post_event(client, event("booking.confirmed"))
    listed = walk(client, "/admin/subscriptions", {"limit": 2})
    assert [s["id"] for s in listed] == [s["id"] for s in created]
    health = listed[0]
    assert (health["state"], health["pending"], health["dead"], health["success_rate"]) == (
        "active",
        1,
        0,
        None,
    )
    assert health["breaker_state"] == "closed"

    target = created[1]["id"]
    off = client.post(f"/admin/subscriptions/{target}/disable", headers=ADMIN)
    assert off.status_code == 200, off.text
    assert (off.json()["state"], off.json()["disabled_reason"]) == ("disabled", "disabled by an operator")
    only_disabled = walk(client, "/admin/subscriptions", {"state": "disabled"})
    assert [s["id"] for s in only_disabled] == [target]
    on = client.post(f"/admin/subscriptions/{target}/enable", headers=ADMIN).json()
    assert (on["state"], on["disabled_reason"]) == ("active", None)
    assert client.get(f"/admin/subscriptions/{target}", headers=ADMIN).json()["state"] == "active"

    deleted = created[2]["id"]
    assert client.delete(f"/services/feed/subscriptions/{deleted}", headers=ADMIN).status_code == 204
    assert_problem(
        client.post(f"/admin/subscriptions/{deleted}/enable", headers=ADMIN), 409, "subscription_deleted"
    )
    assert_problem(
        client.post("/admin/subscriptions/sub_nope/disable", headers=ADMIN), 404, "subscription_not_found"
    )
    with Session(engine) as s:
        row = s.get(Subscription, deleted)
        assert row is not None
        assert row.state == SubscriptionState.DISABLED


def test_health_notices_are_listed_newest_first_by_subscription_and_kind(
    client: TestClient, engine: Engine
) -> None:
    """The engine's notices (breaker opened, re-opened after a failed probe, disabled for
    failing too long) and the operator's, through one listing with filters and cursors."""
    target, other = (subscribe(client, f"{SINK}/{n}")["id"] for n in range(2))
    moment = datetime.now(UTC)
    written = [
        (target, health.NOTICE_BREAKER_OPENED, "10 consecutive failed tries; deliveries paused 30 s"),
        (target, health.NOTICE_BREAKER_REOPENED, "the probe failed; deliveries paused 1 min"),
        (other, health.NOTICE_BREAKER_OPENED, "10 consecutive failed tries; deliveries paused 30 s"),
        (target, health.NOTICE_DISABLED, "deliveries failed continuously for 20 s"),
    ]
    with engine.begin() as connection:
        for n, (subscription_id, kind, detail) in enumerate(written):
            at = moment + timedelta(seconds=n)
            if kind == health.NOTICE_DISABLED:
                assert health.disable(connection, subscription_id, detail, now=at)
            else:
                health.record_notice(connection, subscription_id, kind, detail, now=at)
    assert client.post(f"/admin/subscriptions/{target}/enable", headers=ADMIN).status_code == 200

    mine = walk(client, "/admin/notices", {"subscription_id": target, "limit": 2})
    assert [(n["kind"], n["detail"]) for n in mine] == [
        ("subscription.enabled", ""),
        *[(kind, detail) for subscription_id, kind, detail in reversed(written) if subscription_id == target],
    ]
    opened = walk(client, "/admin/notices", {"kind": "subscription.breaker_opened"})
    assert [n["subscription_id"] for n in opened] == [other, target]
    refused = client.get("/admin/notices", params={"cursor": "nope"}, headers=ADMIN)
    assert_problem(refused, 422, "invalid_cursor")


def test_a_subscriptions_rate_limit_is_set_shown_and_lifted(client: TestClient, engine: Engine) -> None:
    target, other = (subscribe(client, f"{SINK}/{n}")["id"] for n in range(2))

    def stored(subscription_id: str) -> int | None:
        with Session(engine) as s:
            row = s.get(Subscription, subscription_id)
            assert row is not None
            return row.rate_limit

    limited = client.put(f"/admin/subscriptions/{target}/rate-limit", json={"per_second": 5}, headers=ADMIN)
    assert limited.status_code == 200, limited.text
    assert (limited.json()["id"], limited.json()["rate_limit"]) == (target, 5)
    assert stored(target) == 5
    listed = {s["id"]: s["rate_limit"] for s in walk(client, "/admin/subscriptions", {})}
    assert listed == {target: 5, other: None}
    assert client.get(f"/admin/subscriptions/{target}", headers=ADMIN).json()["rate_limit"] == 5

    for refused in (0, -3, operations.MAX_RATE_LIMIT + 1):
        answer = client.put(
            f"/admin/subscriptions/{target}/rate-limit", json={"per_second": refused}, headers=ADMIN
        )
        assert_problem(answer, 422, "invalid_rate_limit")
    for malformed in ({}, {"per_second": "5"}, {"per_second": 2.5}, {"per_second": 5, "burst": 9}):
        answer = client.put(f"/admin/subscriptions/{target}/rate-limit", json=malformed, headers=ADMIN)
        assert_problem(answer, 422, "invalid_request")
    assert stored(target) == 5, "a refused change changes nothing"
    assert_problem(
        client.put("/admin/subscriptions/sub_nope/rate-limit", json={"per_second": 1}, headers=ADMIN),
        404,
        "subscription_not_found",
    )

    lifted = client.put(f"/admin/subscriptions/{target}/rate-limit", json={"per_second": None}, headers=ADMIN)
    assert lifted.status_code == 200, lifted.text
    assert lifted.json()["rate_limit"] is None
    assert stored(target) is None


def test_a_job_that_cannot_reach_the_broker_is_a_problem_naming_it(
    make_client: MakeClient, engine: Engine
) -> None:
    client = make_client(broker_url="redis://127.0.0.1:1/0")  # nothing listens there
    target = subscribe(client, SINK)
    post_event(client, event("booking.confirmed"))  # its own hand-off fails too: logged, kept
    with engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value))
    since = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    response = client.post(
        f"/admin/subscriptions/{target['id']}/recover", json={"since": since}, headers=ADMIN
    )
    problem = assert_problem(response, 503, "broker_unavailable")
    job = client.get(f"/admin/jobs/{problem['job_id']}", headers=ADMIN).json()
    assert (job["status"], job["total"]) == ("running", 1)
    resumed = client.post(f"/admin/jobs/{job['id']}/resume", headers=ADMIN)
    assert_problem(resumed, 503, "broker_unavailable")
