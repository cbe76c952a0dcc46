"""The operator commands end to end: CLI → admin API (uvicorn) → broker → a real Celery worker
subprocess → a receiver on a real server that verifies every signature.

The API serves the test's database (SQLite file or PostgreSQL schema) with the embedded broker;
the worker is ``celery -A usp_workers.runtime.celery_app worker`` configured only by ``USP_*``
variables, as deployed. Commands run in-process through Typer's ``CliRunner`` and reach the API
over HTTP like an operator's terminal would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session
from typer.testing import CliRunner

from tests.dispatcher.admin.live import WAIT, Live, deliveries, event_id_in, wait_until
from tests.workers.endpoints import Answer, UspReceiver
from usp_dispatcher import cli
from usp_dispatcher.cli.output import short_id
from usp_dispatcher.ucap.agents import Agent
from usp_dispatcher.ucap.seed import DEMO_PUBLICATION
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.subscriptions import SubscribeIn, subscribe
from usp_dispatcher.webhooks.samples import sample_event
from usp_schemas import EVENT_TYPES, parse_event
from usp_workers.storage.models import Delivery, DeliveryStatus, Subscription


def test_trigger_then_replay_end_to_end(live: Live) -> None:
    receiver = UspReceiver(live.jwks)
    url, path = live.endpoint("replay", receiver)
    subscription = live.subscribe(url)

    triggered = live.ok("trigger", "booking.confirmed")
    event_id = event_id_in(triggered)
    assert "1 deliveries" in triggered
    wait_until(lambda: receiver.handled == [event_id], "the triggered event delivered", live)

    replayed = live.ok("replay", event_id)
    assert f"replaying {event_id} to {subscription}" in replayed
    wait_until(lambda: len(live.hub.seen(path)) == 2, "the replay delivered", live)
    assert [seen.event_id for seen in live.hub.seen(path)] == [event_id, event_id]
    assert receiver.handled == [event_id], "same event_id: the receiver's dedupe ran the handler once"

    wait_until(
        lambda: {d.status for d in deliveries(live.engine)} == {DeliveryStatus.SUCCEEDED},
        "both deliveries recorded as succeeded",
        live,
    )
    shown = live.ok("events", "show", event_id)
    for delivery in deliveries(live.engine):
        assert short_id(delivery.id) in shown
    assert shown.count("succeeded") >= 4  # two deliveries, one successful attempt each
    detail = json.loads(live.ok("events", "show", event_id, "--json"))
    assert {d["id"] for d in detail["deliveries"]} == {d.id for d in deliveries(live.engine)}
    listed = live.ok("events", "list", "--type", "booking.confirmed")
    assert short_id(event_id) in listed
    assert "2 succeeded" in listed
    assert [e["id"] for e in json.loads(live.ok("events", "list", "--json"))["items"]] == [event_id]
    again = json.loads(live.ok("replay", event_id, "--json"))
    assert again["event_id"] == event_id
    assert [d["subscription_id"] for d in again["deliveries"]] == [subscription]


def test_recover_runs_as_a_job_in_the_worker_with_progress(live: Live) -> None:
    receiver = UspReceiver(live.jwks)
    url, _ = live.endpoint("recover", Answer(503, body=b"[/] [bold]down for maintenance"))
    subscription = live.subscribe(url)
    event_ids = [event_id_in(live.ok("trigger", "booking.cancelled")) for _ in range(3)]
    # The endpoint fails; mark its deliveries dead as the exhausted schedule would (no scheduler
    # runs here to re-send retries).
    wait_until(lambda: all(d.attempt_count >= 1 for d in deliveries(live.engine)), "first tries", live)
    with live.engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value))
    # What the endpoint answered is shown as it was: text, not terminal markup.
    assert "503" in (shown := live.ok("events", "show", event_ids[0]))
    assert "[/] [bold]down for maintenance" in shown
    live.hub.routes["/cli/recover"] = receiver  # the endpoint is back

    output = live.ok("recover", "--subscription", subscription, "--since", "1h")
    assert "done: 3 deliveries re-sent" in output
    job = re.search(r"job_[0-9a-f]{32}", output)
    assert job, output
    assert "done: 3 deliveries re-sent" in live.ok("jobs", "show", job.group(0))
    wait_until(lambda: sorted(receiver.handled) == sorted(event_ids), "every missed event", live)

    dead = json.loads(live.ok("dead-letter", "list", "--subscription", subscription, "--json"))
    assert dead["items"] == [], "recovered: no longer in the dead letter"
    shown = live.ok("events", "show", event_ids[0])
    assert "superseded" in shown, "the old row stays as history"


def test_a_command_that_emits_hands_its_events_to_the_broker_as_the_api_does(
    live: Live, tmp_path: Path
) -> None:
    """``payments confirm`` commits two events in its own process. Nothing here runs the
    scheduler, whose relay would send them only after ``requeue_after_seconds``: they arrive
    because the command handed them to the broker itself before it exited."""
    receiver = UspReceiver(live.jwks)
    url, path = live.endpoint("content", receiver)
    live.subscribe(url, event_types=["content.subscription.activated", "content.entitlement.granted"])
    with Session(live.engine) as session:
        started = subscribe(
            session,
            Agent("https://agent.example/jwks.json", "thumbprint"),
            SubscribeIn(publisher_id=DEMO_PUBLICATION, tier_id="tier_ai_weekly_pro", payment_method="usdc"),
            settings=UcapSettings(),
            base_url=live.base,
        )
    checkout = started.body["checkout"]["session_id"]

    confirmed = subprocess.run(
        [sys.executable, "-m", "usp_dispatcher.cli", "payments", "confirm", checkout],
        env=live.env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert confirmed.returncode == 0, confirmed.stdout + confirmed.stderr
    assert "granted" in confirmed.stdout
    wait_until(lambda: len(receiver.handled) == 2, "both events of the command delivered", live)
    types = [parse_event(seen.body).event for seen in live.hub.seen(path)]
    assert sorted(types) == ["content.entitlement.granted", "content.subscription.activated"]


def test_recover_with_enable_back_fills_what_a_disabled_subscription_missed(live: Live) -> None:
    receiver = UspReceiver(live.jwks)
    url, _ = live.endpoint("was-off", receiver)
    subscription = live.subscribe(url)
    live.ok("subscriptions", "disable", subscription)
    missed = [event_id_in(live.ok("trigger", "booking.cancelled")) for _ in range(3)]
    assert deliveries(live.engine) == [], "emitted while disabled: no delivery at all"

    output = live.ok("recover", "--subscription", subscription, "--since", "1h", "--enable")
    assert "done: 3 deliveries re-sent (3 of them missed while disabled)" in output
    wait_until(lambda: sorted(receiver.handled) == sorted(missed), "every missed event", live)


def test_subscriptions_list_disable_enable_rate_limit(live: Live) -> None:
    url, _ = live.endpoint("subs", Answer(200))
    subscription = live.subscribe(url)
    assert short_id(subscription) in live.ok("subscriptions", "list")
    assert f"{subscription} is disabled" in live.ok("subscriptions", "disable", subscription)
    assert "disabled (disabled by" in live.ok("subscriptions", "list", "--state", "disabled")
    (disabled,) = json.loads(live.ok("subscriptions", "list", "--state", "disabled", "--json"))["items"]
    assert (disabled["id"], disabled["disabled_reason"]) == (subscription, "disabled by an operator")
    assert f"{subscription} is active" in live.ok("subscriptions", "enable", subscription)

    # The notices, newest first, in the table and as JSON; another subscription's are not listed.
    other = live.subscribe(live.endpoint("others", Answer(200))[0])
    live.ok("subscriptions", "disable", other)
    shown = live.ok("subscriptions", "notices", subscription)
    assert shown.index("enabled") < shown.index("disabled by an operator")
    notices = json.loads(live.ok("subscriptions", "notices", subscription, "--json"))["items"]
    assert [(n["subscription_id"], n["kind"]) for n in notices] == [
        (subscription, "subscription.enabled"),
        (subscription, "subscription.disabled"),
    ]
    everyone = json.loads(live.ok("subscriptions", "notices", "--kind", "subscription.disabled", "--json"))
    assert [n["subscription_id"] for n in everyone["items"]] == [other, subscription]

    limited = live.ok("subscriptions", "rate-limit", subscription, "7")
    assert f"{subscription}: at most 7 deliveries per second" in limited
    assert rate_limit(live.engine, subscription) == 7
    assert "7/s" in live.ok("subscriptions", "list")
    refused = live.run("subscriptions", "rate-limit", subscription, "0")
    assert refused.exit_code == 1
    assert "422 invalid_rate_limit" in refused.output
    for unclear in ((subscription,), (subscription, "3", "--off")):
        result = live.run("subscriptions", "rate-limit", *unclear)
        assert result.exit_code == 2
        assert "give either a limit" in result.output
    assert rate_limit(live.engine, subscription) == 7
    assert f"{subscription}: no rate limit" in live.ok("subscriptions", "rate-limit", subscription, "--off")
    assert rate_limit(live.engine, subscription) is None
    assert "7/s" not in live.ok("subscriptions", "list")


def test_tables_fit_80_columns_one_line_per_row(live: Live) -> None:
    """Long ids are shortened, long values cut with an ellipsis: each row stays one line."""
    url, _ = live.endpoint("wide", Answer(503))
    subscriptions = [live.subscribe(url + "/" + "x" * 60) for _ in range(2)]
    event_ids = [event_id_in(live.ok("trigger", "catalog.availability.changed")) for _ in range(3)]
    wait_until(lambda: all(d.attempt_count >= 1 for d in deliveries(live.engine)), "first tries", live)
    with live.engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value))
    for args, ids in (
        (("events", "list"), event_ids),
        (("dead-letter", "list"), event_ids),
        (("subscriptions", "list"), subscriptions),
        (("events", "show", event_ids[0]), subscriptions),
    ):
        output = live.ok(*args)
        lines = output.splitlines()
        assert max(len(line) for line in lines) <= 80, output
        for full in ids:
            rows = [line for line in lines if short_id(full) in line]
            assert rows, (args, full, output)

    # At 80 columns a row keeps what an operator acts on; a wider terminal adds the rest.
    narrow = live.ok("dead-letter", "list").splitlines()
    for event_id in event_ids:
        rows = [line for line in narrow if short_id(event_id) in line]
        assert len(rows) == len(subscriptions), narrow
        for row in rows:
            assert re.search(r"catalog\.availability\.changed\s+1\s+\S+\s+404", row), row  # 404: no route
    assert "subscription" not in narrow[1]
    wide = live.ok("dead-letter", "list", columns=160).splitlines()
    assert "subscription" in wide[1]
    assert all(any(short_id(s) in line for line in wide) for s in subscriptions), "\n".join(wide)
    narrow = live.ok("subscriptions", "list").splitlines()
    for subscription in subscriptions:
        (row,) = [line for line in narrow if short_id(subscription) in line]
        assert re.search(r"active\s+0%/\d+\s+\d+\s+http://127\.0\.0\.1:\d+/cli/wide/x", row), row
    assert "pending" not in narrow[1]
    assert {"last ok", "streak", "pending"} <= set(
        re.split(r"\s{2,}", live.ok("subscriptions", "list", columns=160).splitlines()[1].strip())
    )

    # The short ids the tables print are what the commands take.
    shown = live.ok("events", "show", short_id(event_ids[0]), "--json")
    assert json.loads(shown)["event"]["id"] == event_ids[0]
    one = live.ok("dead-letter", "list", "--subscription", short_id(subscriptions[0]), "--json")
    assert {item["subscription_id"] for item in json.loads(one)["items"]} == {subscriptions[0]}
    unknown = live.run("events", "show", "evt_…00000000")
    assert unknown.exit_code == 1
    assert "no id ends as evt_…00000000 does" in unknown.output


def test_a_missing_or_wrong_token_is_refused(live: Live) -> None:
    missing = live.run("events", "list", token=None)
    assert missing.exit_code == 2
    assert "no admin token" in missing.output
    wrong = live.run("events", "list", token="not-the-token")
    assert wrong.exit_code == 1
    assert "401 invalid_token" in wrong.output
    assert "not-the-token" not in wrong.output
    unknown = live.run("replay", "evt_nope")
    assert unknown.exit_code == 1
    assert "404 event_not_found" in unknown.output


def test_sample_events_are_valid_and_fresh() -> None:
    for event_type in EVENT_TYPES:
        first, second = parse_event(sample_event(event_type)), parse_event(sample_event(event_type))
        assert first.event == event_type
        assert first.event_id != second.event_id
    result = CliRunner().invoke(cli.app, ["trigger", "waitlist.nope"], env={"USP_ADMIN_TOKEN": "t"})
    assert result.exit_code == 2
    assert "no sample for 'waitlist.nope'" in result.output


def rate_limit(engine: Engine, subscription_id: str) -> int | None:
    with Session(engine) as s:
        row = s.get(Subscription, subscription_id)
        assert row is not None
        return row.rate_limit
