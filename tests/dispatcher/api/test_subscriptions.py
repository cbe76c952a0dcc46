"""``/services/feed/subscriptions``: create (SSRF and pattern checks), list, get, delete, lease."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import ADMIN, MakeClient
from tests.dispatcher.support import assert_problem, subscribe
from usp_dispatcher.errors import Refused
from usp_dispatcher.webhooks.feed import normalize_event_types
from usp_schemas import EVENT_TYPES
from usp_workers.operations import LEASE_LAPSED
from usp_workers.runtime.relay import relay_once
from usp_workers.settings import SchedulerSettings

PATH = "/services/feed/subscriptions"
HOOK = "http://127.0.0.1:9/hooks/usp"


def test_create_and_read_back(client: TestClient) -> None:
    created = subscribe(
        client,
        HOOK,
        ["booking.*", "waitlist.offered"],
        transport="jsonrpc",
        platform_profile="https://p.example/x",
    )
    assert created["id"].startswith("sub_")
    assert created["url"] == HOOK
    assert created["transport"] == "jsonrpc"
    assert created["event_types"] == ["booking.*", "waitlist.offered"]
    assert created["platform_profile"] == "https://p.example/x"
    assert created["state"] == "active"
    assert created["disabled_reason"] is None
    fetched = client.get(f"{PATH}/{created['id']}", headers=ADMIN)
    assert fetched.status_code == 200
    assert fetched.json() == created


def test_defaults(client: TestClient) -> None:
    created = subscribe(client, HOOK)
    assert created["transport"] == "rest"
    assert created["event_types"] == ["*"]
    assert created["platform_profile"] is None
    assert (created["ordering"], created["on_dead"]) == ("none", "block")


def test_an_ordered_subscription_and_its_dead_letter_policy(client: TestClient) -> None:
    created = subscribe(client, HOOK, ordering="subject", on_dead="skip")
    assert (created["ordering"], created["on_dead"]) == ("subject", "skip")
    assert client.get(f"{PATH}/{created['id']}", headers=ADMIN).json() == created
    health = client.get(f"/admin/subscriptions/{created['id']}", headers=ADMIN).json()
    assert (health["ordering"], health["on_dead"], health["blocked_subjects"]) == ("subject", "skip", 0)
    for wrong in ({"ordering": "global"}, {"on_dead": "drop"}):
        assert_problem(client.post(PATH, json={"url": HOOK, **wrong}, headers=ADMIN), 422, "invalid_request")


@pytest.mark.parametrize("pattern", ["bookings.*", "booking.exploded", "", "catalog.*.removed"])
def test_patterns_that_match_nothing_are_refused(client: TestClient, pattern: str) -> None:
    response = client.post(PATH, json={"url": HOOK, "event_types": [pattern]}, headers=ADMIN)
    problem = assert_problem(response, 422, "unknown_event_type")
    assert repr(pattern) in problem["detail"]
    assert client.get(PATH, headers=ADMIN).json()["items"] == []


def test_empty_pattern_list_is_refused(client: TestClient) -> None:
    response = client.post(PATH, json={"url": HOOK, "event_types": []}, headers=ADMIN)
    assert_problem(response, 422, "invalid_request")


def test_bad_transport_and_unknown_fields_are_refused(client: TestClient) -> None:
    assert_problem(
        client.post(PATH, json={"url": HOOK, "transport": "smtp"}, headers=ADMIN), 422, "invalid_request"
    )
    assert_problem(
        client.post(PATH, json={"url": HOOK, "secret": "x"}, headers=ADMIN), 422, "invalid_request"
    )


def test_normalize_event_types_accepts_every_known_type_and_glob() -> None:
    assert normalize_event_types(EVENT_TYPES) == list(EVENT_TYPES)
    assert normalize_event_types(["*", "catalog.*", "booking.no_show", "*"]) == [
        "*",
        "catalog.*",
        "booking.no_show",
    ]
    with pytest.raises(Refused) as caught:
        normalize_event_types(["Booking.*"])  # case matters: event types are lower case
    assert caught.value.reason == "unknown_event_type"


def test_private_target_refused_unless_allowed(make_client: MakeClient) -> None:
    strict = make_client(allow_private_targets=False)
    for url in (HOOK, "http://[::1]:8080/h", "http://2130706433/"):
        problem = assert_problem(strict.post(PATH, json={"url": url}, headers=ADMIN), 422, "target_refused")
        assert problem["target_reason"] == "private_address"
        # The refusal names the way out, for development and for production.
        for way_out in (
            "USP_ALLOW_PRIVATE_TARGETS=true",
            "usp-webhooks up --dev",
            "USP_PRIVATE_TARGET_ALLOWLIST",
        ):
            assert way_out in problem["detail"]
    assert strict.get(PATH, headers=ADMIN).json()["items"] == []

    relaxed = make_client(allow_private_targets=True)
    assert relaxed.post(PATH, json={"url": HOOK}, headers=ADMIN).status_code == 201
    # Development mode opens loopback and private ranges, never the cloud's metadata service.
    for client in (strict, relaxed):
        for url in (
            "http://169.254.169.254/latest",
            "http://[fd00:ec2::254]/",
            "http://metadata.google.internal/",
        ):
            problem = assert_problem(
                client.post(PATH, json={"url": url}, headers=ADMIN), 422, "target_refused"
            )
            assert problem["target_reason"] == "metadata_address"


def test_allowlisted_range_is_accepted(make_client: MakeClient) -> None:
    client = make_client(allow_private_targets=False, private_target_allowlist=("127.0.0.0/8",))
    assert client.post(PATH, json={"url": HOOK}, headers=ADMIN).status_code == 201


def test_name_resolving_to_a_private_address_is_refused(make_client: MakeClient) -> None:
    client = make_client(allow_private_targets=False)
    asked: list[tuple[str, int]] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return {"public.example": ["93.184.215.14"], "sneaky.example": ["93.184.215.14", "10.0.0.5"]}[host]

    client.app.state.target_resolver = resolver  # type: ignore[attr-defined]
    problem = assert_problem(
        client.post(PATH, json={"url": "https://sneaky.example/hook"}, headers=ADMIN), 422, "target_refused"
    )
    assert problem["target_reason"] == "private_address"
    assert client.post(PATH, json={"url": "https://public.example/hook"}, headers=ADMIN).status_code == 201
    assert asked == [("sneaky.example", 443), ("public.example", 443)]


@pytest.mark.parametrize(
    ("url", "target_reason"),
    [
        ("ftp://127.0.0.1/x", "bad_scheme"),
        ("http://user:pw@127.0.0.1/x", "credentials_in_url"),
        ("hooks", "bad_scheme"),
    ],
)
def test_malformed_targets_are_refused(client: TestClient, url: str, target_reason: str) -> None:
    problem = assert_problem(client.post(PATH, json={"url": url}, headers=ADMIN), 422, "target_refused")
    assert problem["target_reason"] == target_reason
    assert "pw" not in problem["detail"]


def test_list_pages_by_cursor(client: TestClient) -> None:
    ids = [subscribe(client, f"{HOOK}/{n}")["id"] for n in range(5)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = client.get(PATH, params=params, headers=ADMIN).json()
        pages += 1
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids  # every one, once, oldest first
    assert pages == 3


def test_list_limit_is_bounded(client: TestClient) -> None:
    assert_problem(client.get(PATH, params={"limit": 0}, headers=ADMIN), 422, "invalid_request")
    assert_problem(client.get(PATH, params={"limit": 10_000}, headers=ADMIN), 422, "invalid_request")


def test_delete_disables_and_keeps_the_row(client: TestClient) -> None:
    kept = subscribe(client, HOOK + "/kept")
    doomed = subscribe(client, HOOK + "/doomed")
    response = client.delete(f"{PATH}/{doomed['id']}", headers=ADMIN)
    assert response.status_code == 204
    assert response.content == b""
    after = client.get(f"{PATH}/{doomed['id']}", headers=ADMIN).json()
    assert (after["state"], after["disabled_reason"]) == ("disabled", "deleted")
    # Deleting again changes nothing.
    assert client.delete(f"{PATH}/{doomed['id']}", headers=ADMIN).status_code == 204

    listed = {item["id"]: item["state"] for item in client.get(PATH, headers=ADMIN).json()["items"]}
    assert listed == {kept["id"]: "active", doomed["id"]: "disabled"}
    active = client.get(PATH, params={"state": "active"}, headers=ADMIN).json()["items"]
    assert [item["id"] for item in active] == [kept["id"]]


def test_unknown_subscription_is_a_404_problem(client: TestClient) -> None:
    assert_problem(client.get(f"{PATH}/sub_nope", headers=ADMIN), 404, "subscription_not_found")
    assert_problem(client.delete(f"{PATH}/sub_nope", headers=ADMIN), 404, "subscription_not_found")


def test_url_is_stored_as_the_client_will_send_it(client: TestClient) -> None:
    """Signatures cover @authority and @path: store the form httpx puts on the wire, or the
    receiver would see a path we did not sign (``/a/../b`` goes out as ``/b``)."""
    created = subscribe(client, "http://127.0.0.1:9/hooks/../usp hooks?x=a b")
    assert created["url"] == "http://127.0.0.1:9/usp%20hooks?x=a%20b"


def test_a_leased_subscription_is_renewed_and_lapses_when_it_is_not(
    client: TestClient, engine: Engine, database_url: str
) -> None:
    """A listener's subscription: ``lease_seconds`` from its creation, extended by each renewal;
    the scheduler's pass after the lease passed deletes it, with a notice saying why."""
    leased = subscribe(client, HOOK, lease_seconds=60)
    permanent = subscribe(client, HOOK)
    assert permanent["lease_until"] is None
    first = datetime.fromisoformat(leased["lease_until"])
    assert (
        timedelta(seconds=55) < first - datetime.fromisoformat(leased["created_at"]) <= timedelta(seconds=60)
    )

    renewed = client.post(f"{PATH}/{leased['id']}/lease", json={"lease_seconds": 600}, headers=ADMIN)
    assert renewed.status_code == 200, renewed.text
    until = datetime.fromisoformat(renewed.json()["lease_until"])
    assert until - first > timedelta(seconds=500)

    settings = SchedulerSettings(_env_file=None, database_url=database_url)
    assert relay_once(engine, settings, lambda _ids: None, now=until - timedelta(seconds=1)).lapsed == 0
    report = relay_once(engine, settings, lambda _ids: None, now=until + timedelta(seconds=1))
    assert report.lapsed == 1
    gone = client.get(f"{PATH}/{leased['id']}", headers=ADMIN).json()
    assert (gone["state"], gone["disabled_reason"]) == ("disabled", "deleted")
    assert client.get(f"{PATH}/{permanent['id']}", headers=ADMIN).json()["state"] == "active"
    notices = client.get("/admin/notices", params={"subscription_id": leased["id"]}, headers=ADMIN).json()
    assert [(n["kind"], n["detail"]) for n in notices["items"]] == [("subscription.disabled", LEASE_LAPSED)]

    again = client.post(f"{PATH}/{leased['id']}/lease", json={"lease_seconds": 60}, headers=ADMIN)
    assert_problem(again, 409, "subscription_deleted")
    unleased = client.post(f"{PATH}/{permanent['id']}/lease", json={"lease_seconds": 60}, headers=ADMIN)
    assert_problem(unleased, 409, "not_leased")
    assert_problem(
        client.post(f"{PATH}/sub_nope/lease", json={"lease_seconds": 60}, headers=ADMIN),
        404,
        "subscription_not_found",
    )
    for seconds in (0, 9, 86_401):
        too = client.post(PATH, json={"url": HOOK, "lease_seconds": seconds}, headers=ADMIN)
        assert_problem(too, 422, "invalid_request")


def test_a_payload_filter_is_checked_saved_shown_and_replaced(client: TestClient) -> None:
    haircuts = {
        "all": [{"path": "data.service_id", "eq": "svc_haircut_001"}, {"path": "data.state", "ne": "x"}]
    }
    created = subscribe(client, HOOK, ["booking.*"], filter=haircuts)
    assert created["filter"] == haircuts
    assert client.get(f"{PATH}/{created['id']}", headers=ADMIN).json()["filter"] == haircuts
    assert subscribe(client, HOOK)["filter"] is None

    bad = client.post(
        PATH, json={"url": HOOK, "filter": {"any": [{"path": "data.x", "matches": "a+"}]}}, headers=ADMIN
    )
    assert_problem(bad, 422, "invalid_filter")
    assert bad.json()["where"] == "$.any[0]"
    assert "'matches'" in bad.json()["detail"]

    replaced = client.put(
        f"{PATH}/{created['id']}/filter",
        json={"filter": {"path": "data.price.amount", "gte": 50}},
        headers=ADMIN,
    )
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["filter"] == {"path": "data.price.amount", "gte": 50}
    refused = client.put(
        f"{PATH}/{created['id']}/filter", json={"filter": {"path": "a..b", "eq": 1}}, headers=ADMIN
    )
    assert_problem(refused, 422, "invalid_filter")
    removed = client.put(f"{PATH}/{created['id']}/filter", json={"filter": None}, headers=ADMIN)
    assert removed.json()["filter"] is None
    missing = client.put(f"{PATH}/sub_nope/filter", json={"filter": None}, headers=ADMIN)
    assert_problem(missing, 404, "subscription_not_found")
