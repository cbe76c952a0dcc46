"""The operator console (``/console``) in a real browser: Playwright driving the system Chromium
against the whole service (API under uvicorn, a real Celery worker, receivers that verify every
signature), on PostgreSQL.

The browser and the screenshots: :mod:`tests.dispatcher.admin.browser`.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from playwright.sync_api import Browser, BrowserContext, Page, expect
from sqlmodel import Session
from standardwebhooks import Webhook

from tests.dispatcher.admin.browser import screenshot
from tests.dispatcher.admin.live import Live, deliveries, event_id_in, wait_until
from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN
from tests.workers.endpoints import Answer, UspReceiver
from usp_dispatcher.webhooks.samples import sample_event
from usp_workers.storage.models import Delivery, DeliveryStatus, Subscription

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


@pytest.fixture
def context(browser: Browser, live: Live) -> Iterator[BrowserContext]:
    made = browser.new_context(base_url=live.base, viewport={"width": 1200, "height": 900})
    made.set_default_timeout(20_000)
    yield made
    made.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


def log_in(page: Page, token: str = ADMIN_TOKEN) -> None:
    page.goto("/console/login")
    page.fill("input[name=token]", token)
    page.click("button:has-text('Log in')")


def booking_event(live: Live, event_type: str, booking_id: str) -> str:
    """Post a ``booking.*`` event about ``booking_id``; its ``event_id``."""
    body = json.loads(sample_event(event_type))
    body["booking_id"] = body["data"]["id"] = booking_id
    response = httpx.post(live.base + "/events", json=body, headers=ADMIN)
    assert response.status_code == 202, response.text
    return str(response.json()["event_id"])


def test_an_operator_finds_a_booking_s_event_replays_it_and_sees_the_new_attempt_arrive(
    live: Live, page: Page, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = UspReceiver(live.jwks)
    url, path = live.endpoint("console", receiver)
    live.subscribe(url)
    booking = "bkg_" + uuid.uuid4().hex[:12]
    event_id = booking_event(live, "booking.confirmed", booking)
    booking_event(live, "booking.confirmed", "bkg_someone_else")  # not to be found
    wait_until(lambda: event_id in receiver.handled, "the event delivered", live)

    log_in(page)
    expect(page).to_have_url(f"{live.base}/console/events")
    page.fill("input[name=subject]", booking)
    page.click("button:has-text('Search')")
    rows = page.locator("table.events tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("booking.confirmed")
    rows.first.locator("a").click()

    expect(page.locator("h1")).to_contain_text(event_id)
    expect(page.locator(".delivery")).to_have_count(1)
    expect(page.locator(".attempt")).to_have_count(1)
    expect(page.locator(".attempt").first).to_contain_text("200")
    [kid] = [k["kid"] for k in httpx.get(live.base + "/.well-known/usp/jwks.json").json()["keys"]]
    expect(page.locator(".attempt .key-ids").first).to_have_text(kid)
    expect(page.locator(".timeline li").first).to_contain_text("accepted")
    expect(page.locator(".timeline")).to_contain_text("attempt 1 of dlv_")
    expect(page.locator(".payload")).to_contain_text(booking)

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Replay')")
    expect(page.get_by_role("status")).to_contain_text("Replayed: 1 new delivery")
    # The page follows the new delivery by itself until it has settled.
    expect(page.locator(".delivery")).to_have_count(2)
    expect(page.locator(".attempt")).to_have_count(2)
    expect(page.locator("#deliveries")).to_have_attribute("data-live", "")
    expect(page.locator(".delivery > h3 .status-succeeded")).to_have_count(2)
    screenshot(page, "console.png", tmp_path)

    assert [seen.event_id for seen in live.hub.seen(path)].count(event_id) == 2
    assert {d.status for d in deliveries(live.engine)} == {DeliveryStatus.SUCCEEDED}
    assert ADMIN_TOKEN not in page.url
    assert ADMIN_TOKEN not in caplog.text, "the token never reaches a log"


def test_without_a_session_pages_send_to_the_login_and_actions_are_refused(
    live: Live, context: BrowserContext, page: Page
) -> None:
    event_id = event_id_in(live.ok("trigger", "booking.confirmed"))
    for path in ("/console", "/console/events", f"/console/events/{event_id}"):
        page.goto(path)
        expect(page).to_have_url(f"{live.base}/console/login")
    refused = context.request.post(f"/console/events/{event_id}/replay", form={"csrf": "x"})
    assert refused.status == 401

    log_in(page, "not-the-token")
    expect(page.get_by_role("alert")).to_contain_text("not the admin token")
    assert context.cookies() == []

    log_in(page)
    [cookie] = context.cookies()
    assert (cookie["name"], cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (
        "usp_console",
        True,
        "Strict",
        "/console",
    )
    assert ADMIN_TOKEN not in cookie["value"]
    page.click("button:has-text('Log out')")
    expect(page).to_have_url(f"{live.base}/console/login")
    page.goto("/console/events")
    expect(page).to_have_url(f"{live.base}/console/login")


def test_an_action_without_the_session_s_csrf_token_or_from_another_origin_is_refused(
    live: Live, context: BrowserContext, page: Page
) -> None:
    live.subscribe(live.endpoint("csrf", UspReceiver(live.jwks))[0])
    event_id = event_id_in(live.ok("trigger", "booking.confirmed"))
    log_in(page)
    page.goto(f"/console/events/{event_id}")
    csrf = page.locator("input[name=csrf]").first.input_value()
    before = len(deliveries(live.engine))

    altered = csrf[:-1] + ("0" if csrf[-1] != "0" else "1")
    forms: list[dict[str, str | float | bool]] = [{}, {"csrf": "forged"}, {"csrf": altered}]
    for form in forms:
        answer = context.request.post(f"/console/events/{event_id}/replay", form=form)
        assert answer.status == 403, form
        assert answer.json()["reason"] == "csrf_token_invalid"
    cross = context.request.post(
        f"/console/events/{event_id}/replay", form={"csrf": csrf}, headers={"Origin": "https://evil.example"}
    )
    assert (cross.status, cross.json()["reason"]) == (403, "cross_origin")
    assert len(deliveries(live.engine)) == before, "nothing was replayed"

    replay = f"/console/events/{event_id}/replay"
    accepted = context.request.post(replay, form={"csrf": csrf}, max_redirects=0)
    assert (accepted.status, accepted.headers["location"]) == (303, f"/console/events/{event_id}?replayed=1")
    assert len(deliveries(live.engine)) == before + 1


def metric(live: Live, name: str) -> float:
    text = httpx.get(live.base + "/metrics", headers=ADMIN).text
    [value] = [line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")]
    return float(value)


def test_redriving_the_dead_letter_shows_the_job_s_progress_and_the_counts_agree_with_metrics(
    live: Live, page: Page, tmp_path: Path
) -> None:
    receiver = UspReceiver(live.jwks)
    url, path = live.endpoint("dead", Answer(503))
    live.subscribe(url)
    dead = [booking_event(live, "booking.cancelled", f"bkg_dead_{n}") for n in range(3)]
    wait_until(lambda: all(d.attempt_count >= 1 for d in deliveries(live.engine)), "first tries", live)
    # Exhausted, as the schedule would leave them (no scheduler runs here to retry them).
    with live.engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value))
    live.hub.routes[path] = receiver  # the endpoint is back

    log_in(page)
    page.click("nav >> text=Dead letter")
    expect(page.locator("table.dead tbody tr")).to_have_count(3)
    expect(page.locator(".totals [data-status=dead]")).to_have_text("3")
    assert metric(live, "usp_dead_letter_size") == 3

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Redrive all')")
    expect(page).to_have_url(re.compile(r"/console/jobs/job_[0-9a-f]{32}$"))
    expect(page.locator(".job-status")).to_contain_text("Done: 3 deliveries re-sent", timeout=60_000)
    expect(page.locator("progress")).to_have_attribute("value", "3")
    expect(page.locator("#job")).to_have_attribute("data-live", "")
    screenshot(page, "console-redrive.png", tmp_path)
    wait_until(lambda: sorted(receiver.handled) == sorted(dead), "every dead event delivered", live)

    page.click("nav >> text=Dead letter")
    expect(page.locator("main")).to_contain_text("Nothing is dead")
    expect(page.locator(".totals [data-status=dead]")).to_have_count(0)
    expect(page.locator(".totals [data-status=superseded]")).to_have_text("3")
    assert metric(live, "usp_dead_letter_size") == 0


def test_a_subscription_s_health_chart_and_controls(live: Live, page: Page, tmp_path: Path) -> None:
    receiver = UspReceiver(live.jwks)
    healthy = live.subscribe(live.endpoint("healthy", receiver)[0])
    failing = live.subscribe(live.endpoint("failing", Answer(500))[0])
    sent = [booking_event(live, "booking.confirmed", f"bkg_health_{n}") for n in range(4)]
    wait_until(lambda: sorted(receiver.handled) == sorted(sent), "delivered to the healthy one", live)
    wait_until(
        lambda: sum(d.attempt_count for d in deliveries(live.engine) if d.subscription_id == failing) >= 4,
        "tried at the failing one",
        live,
    )

    log_in(page)
    page.click("nav >> text=Subscriptions")
    expect(page.locator("table.subscriptions tbody tr")).to_have_count(2)
    page.click(f"text={healthy}")
    expect(page.locator(".success-rate")).to_contain_text("100.0% of 4 attempts")
    expect(page.locator(".latency")).to_contain_text("p50")
    expect(page.locator("#activity-chart")).to_have_attribute("data-drawn", "1")
    expect(page.locator("#activity-chart canvas")).to_have_count(1)

    page.fill("input[name=per_second]", "many")
    page.click("button:has-text('Set limit')")
    expect(page.get_by_role("alert")).to_contain_text("not a whole number")
    page.fill("input[name=per_second]", "5")
    page.click("button:has-text('Set limit')")
    expect(page.locator(".rate-limit")).to_have_text("5 deliveries/s")
    assert rate_limit(live, healthy) == 5

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Disable')")
    expect(page.locator(".disabled-reason")).to_contain_text("disabled by an operator")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Enable')")
    expect(page.locator(".health")).to_contain_text("active")
    expect(page.locator(".disabled-reason")).to_have_count(0)

    page.goto(f"/console/subscriptions/{failing}")
    expect(page.locator(".failures")).not_to_contain_text("0 in a row")
    expect(page.locator("#activity-chart")).to_have_attribute("data-drawn", re.compile(r"[1-9]"))
    screenshot(page, "console-subscription.png", tmp_path)


def rate_limit(live: Live, subscription_id: str) -> int | None:
    with Session(live.engine) as session:
        row = session.get(Subscription, subscription_id)
        assert row is not None
        return row.rate_limit


def test_the_keys_page_rotates_a_key_that_is_published_before_it_signs(live: Live, page: Page) -> None:
    log_in(page)
    page.click("nav >> text=Keys")
    rows = page.locator("table.keys tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("signing")
    [first] = [k["kid"] for k in httpx.get(live.base + "/.well-known/usp/jwks.json").json()["keys"]]

    page.select_option("select[name=alg]", "ecdsa-p256-sha256")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Rotate')")
    expect(page.get_by_role("status")).to_contain_text("Added")
    expect(rows).to_have_count(2)
    new = rows.first
    expect(new).to_contain_text("published, not signing yet")
    expect(new).to_contain_text("ecdsa-p256-sha256")
    kid = new.get_attribute("data-kid")
    published = {k["kid"] for k in httpx.get(live.base + "/.well-known/usp/jwks.json").json()["keys"]}
    assert published == {first, kid}
    expect(page.locator("table.keys")).not_to_contain_text("PRIVATE")
    assert '"d"' not in page.content(), "no private key material on the page"


def test_recovering_a_subscription_s_time_range_from_its_page(live: Live, page: Page) -> None:
    receiver = UspReceiver(live.jwks)
    url, path = live.endpoint("recover", Answer(503))
    subscription = live.subscribe(url)
    missed = [booking_event(live, "booking.cancelled", f"bkg_recover_{n}") for n in range(2)]
    wait_until(lambda: all(d.attempt_count >= 1 for d in deliveries(live.engine)), "first tries", live)
    with live.engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value))
    live.hub.routes[path] = receiver

    log_in(page)
    page.goto(f"/console/subscriptions/{subscription}")
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    page.fill("input[name=since]", an_hour_ago)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Recover')")
    expect(page.locator("h1")).to_contain_text("Recover")
    expect(page.locator(".job-status")).to_contain_text("Done: 2 deliveries re-sent", timeout=60_000)
    wait_until(lambda: sorted(receiver.handled) == sorted(missed), "every missed event delivered", live)


def test_the_console_works_by_keyboard_and_fits_a_phone_width_screen(live: Live, browser: Browser) -> None:
    event_id = event_id_in(live.ok("trigger", "booking.confirmed"))
    subscription = live.subscribe(live.endpoint("phone", UspReceiver(live.jwks))[0])
    phone = browser.new_context(base_url=live.base, viewport={"width": 375, "height": 740})
    page = phone.new_page()
    page.goto("/console/login")
    page.keyboard.type(ADMIN_TOKEN)  # the token field has the focus
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{live.base}/console/events")
    page.keyboard.press("Tab")  # the first stop is the header's link, visibly focused
    assert page.evaluate("document.activeElement.tagName") == "A"
    for path in (
        "/console/events",
        f"/console/events/{event_id}",
        "/console/dead-letter",
        "/console/subscriptions",
        f"/console/subscriptions/{subscription}",
        "/console/keys",
    ):
        page.goto(path)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} is {overflow} px wider than the screen"
    phone.close()


@pytest.mark.parametrize("width", [390, 1280])
def test_deliveries_read_in_full_on_a_phone_and_a_desktop(
    live: Live, browser: Browser, width: int, tmp_path: Path
) -> None:
    """At 390 px (a phone) and 1280 px: an event's attempts show every column inside the screen,
    a try that never got an answer says what failed, the dead letter's ids stay on one line and
    its subscription is a link, and a subscription's page lists its recent deliveries."""
    gone = live.subscribe("http://127.0.0.1:9/gone")  # nothing listens: refused, then dead
    live.subscribe(live.endpoint(f"fine-{width}", UspReceiver(live.jwks))[0])
    event_id = event_id_in(live.ok("trigger", "booking.confirmed"))
    wait_until(lambda: tried_once(live, gone), "one delivery refused once, the other delivered", live)
    with live.engine.begin() as connection:  # its schedule spent (no scheduler runs here to retry)
        connection.execute(
            sa.update(Delivery)
            .where(Delivery.subscription_id == gone)  # type: ignore[arg-type]
            .values(status=DeliveryStatus.DEAD.value, completed_at=datetime.now(UTC))
        )
    screen = browser.new_context(base_url=live.base, viewport={"width": width, "height": 900})
    page = screen.new_page()
    log_in(page)

    page.goto(f"/console/events/{event_id}")
    refused = page.locator(f".delivery:has(a[href='/console/subscriptions/{gone}'])")
    expect(refused.locator("td.answer").first).to_have_text("connection refused (nothing listens there)")
    expect(refused.locator("td.response").first).to_contain_text("none: connection refused")
    assert_in_view(page, ".attempts td", width)
    screenshot(page, f"console-event-{width}.png", tmp_path)

    page.goto("/console/dead-letter")
    rows = page.locator("table.dead tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td.answer")).to_have_text("connection refused (nothing listens there)")
    assert_in_view(page, "table.dead td", width)
    lines = page.eval_on_selector_all("table.dead code.id", "ids => ids.map(i => i.getClientRects().length)")
    assert lines == [1, 1], "each id on one line"
    rows.first.locator(f"a[href='/console/subscriptions/{gone}']").click()
    expect(page.locator("h1")).to_contain_text(gone)

    recent = page.locator("#recent tbody tr")
    expect(recent).to_have_count(1)
    expect(recent.first).to_contain_text("booking.confirmed")
    expect(recent.first.locator("td.answer")).to_have_text("connection refused (nothing listens there)")
    assert_in_view(page, "#recent td", width)
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{overflow} px wider than the screen"
    screen.close()


def tried_once(live: Live, refused_to: str) -> bool:
    rows = deliveries(live.engine)
    refused = [(d.status, d.attempt_count) for d in rows if d.subscription_id == refused_to]
    return refused == [(DeliveryStatus.PENDING, 1)] and DeliveryStatus.SUCCEEDED in {d.status for d in rows}


def assert_in_view(page: Page, cells: str, width: int) -> None:
    """Every cell the selector finds is shown whole within the screen's width (no horizontal
    scrolling needed to read it)."""
    boxes = page.eval_on_selector_all(
        cells, "cells => cells.map(c => { const r = c.getBoundingClientRect(); return [r.left, r.right] })"
    )
    assert boxes, cells
    outside = [box for box in boxes if box[0] < -0.5 or box[1] > width + 0.5]
    assert not outside, f"{cells}: {len(outside)} of {len(boxes)} cells reach past {width} px: {outside}"


def test_a_standard_webhooks_secret_is_rotated_from_the_console_and_shown_once(
    live: Live, page: Page
) -> None:
    created = httpx.post(
        live.base + "/services/feed/subscriptions",
        json={
            "url": live.endpoint("rotating", Answer(200))[0],
            "signatures": ["rfc9421", "standard-webhooks"],
        },
        headers=ADMIN,
    ).json()
    log_in(page)
    page.goto(f"/console/subscriptions/{created['id']}")
    expect(page.locator("dd.signatures")).to_have_text("rfc9421, standard-webhooks")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("button:has-text('Rotate secret')")
    secret = page.locator(".new-secret code.secret")
    expect(secret).to_have_text(re.compile(r"^whsec_\S+$"))
    assert secret.inner_text() != created["webhook_secret"]
    page.goto(f"/console/subscriptions/{created['id']}")
    expect(page.locator(".new-secret")).to_have_count(0)  # once
    assert "whsec_" not in page.content()


def test_a_subscription_is_created_from_the_console_with_standard_webhooks(live: Live, page: Page) -> None:
    """The form asks for a URL, event types, a transport and the signatures; the secret is shown
    on the new subscription's page once, and a delivery verifies under it in the spec's library;
    a URL the service refuses is refused on the form, which keeps what was typed."""
    log_in(page)
    page.goto("/console/subscriptions")
    page.click("summary:has-text('New subscription')")
    page.fill("input[name=url]", "http://169.254.169.254/latest/meta-data")
    page.fill("input[name=event_types]", "booking.*")
    page.click("button:has-text('Create')")
    expect(page.get_by_role("alert")).to_contain_text("refused")
    expect(page.locator("input[name=event_types]")).to_have_value("booking.*")

    url, path = live.endpoint("console-made", Answer(200))
    page.fill("input[name=url]", url)
    page.check("input[value=standard-webhooks]")
    page.fill("textarea[name=headers]", "X-Tenant: acme")
    page.fill("textarea[name=secret_headers]", "X-Gateway-Key: gw-7d1e")
    page.click("button:has-text('Create')")
    expect(page).to_have_url(re.compile(r"/console/subscriptions$"))
    expect(page.locator(".notice.created")).to_be_visible()
    expect(page.locator("dd.signatures")).to_have_text("rfc9421, standard-webhooks")
    expect(page.locator("dd.headers")).to_have_text("X-Tenant: acme, X-Gateway-Key: ********")
    secret = page.locator(".new-secret code.secret").inner_text()
    assert secret.startswith("whsec_")
    subscription_id = page.locator("h1 small").inner_text()
    with Session(live.engine) as session:
        made = session.get(Subscription, subscription_id)
        assert made is not None
        assert json.loads(made.event_types) == ["booking.*"]
        assert secret not in (made.webhook_secrets or ""), "stored sealed"

    event_id = booking_event(live, "booking.confirmed", "bkg_console_made")
    wait_until(lambda: len(live.hub.seen(path)) == 1, "the delivery", live)
    (seen,) = live.hub.seen(path)
    assert Webhook(secret).verify(seen.body, seen.headers)["event_id"] == event_id
    assert (seen.headers["x-tenant"], seen.headers["x-gateway-key"]) == ("acme", "gw-7d1e")
    page.goto(f"/console/subscriptions/{subscription_id}")
    assert "whsec_" not in page.content(), "shown once"
    assert "gw-7d1e" not in page.content(), "masked"


def test_a_payload_filter_from_the_cli_and_the_console_and_why_an_event_did_not_match(
    live: Live, page: Page
) -> None:
    """``subscriptions create --filter`` takes only the service's bookings: the other service's
    booking gets no delivery, and its console page says which subscription took it and why the
    filtered one did not; the console's form refuses a filter that is not JSON, keeping it."""
    url, path = live.endpoint("haircuts", Answer(200))
    haircuts = '{"path": "data.service_id", "eq": "svc_haircut_001"}'
    made = live.ok("subscriptions", "create", url, "--event-type", "booking.*", "--filter", haircuts)
    subscription_id = made.split(":")[0]
    assert 'filter: {"eq": "svc_haircut_001", "path": "data.service_id"}' in made

    def booking(service_id: str, booking_id: str) -> str:
        body = json.loads(sample_event("booking.confirmed"))
        body["booking_id"] = body["data"]["id"] = booking_id
        body["service_id"] = body["data"]["service_id"] = service_id
        response = httpx.post(live.base + "/events", json=body, headers=ADMIN)
        assert response.status_code == 202, response.text
        return str(response.json()["event_id"])

    massage = booking("svc_massage_002", "bkg_massage")
    haircut = booking("svc_haircut_001", "bkg_haircut")
    wait_until(lambda: len(live.hub.seen(path)) == 1, "the haircut's delivery", live)
    assert json.loads(live.hub.seen(path)[0].body)["event_id"] == haircut
    assert not [d for d in deliveries(live.engine) if d.event_id == massage]

    log_in(page)
    page.goto(f"/console/events/{massage}")
    row = page.locator(f"table.matching tr[data-subscription={subscription_id}]")
    expect(row.locator(".why")).to_have_text(
        'no: its filter: data.service_id eq "svc_haircut_001" (found "svc_massage_002")'
    )
    page.goto(f"/console/events/{haircut}")
    expect(page.locator(f"table.matching tr[data-subscription={subscription_id}] .why")).to_have_text("yes")
    page.goto(f"/console/subscriptions/{subscription_id}")
    expect(page.locator("dd.filter code")).to_have_text('{"eq":"svc_haircut_001","path":"data.service_id"}')

    page.goto("/console/subscriptions")
    page.click("summary:has-text('New subscription')")
    page.fill("input[name=url]", url)
    page.fill("textarea[name=filter]", '{"path": "data.service_id", "eq": ')
    page.click("button:has-text('Create')")
    expect(page.get_by_role("alert")).to_contain_text("the filter is not JSON")
    expect(page.locator("textarea[name=filter]")).to_have_value('{"path": "data.service_id", "eq": ')
    page.fill("textarea[name=filter]", '{"path": "data.service_id", "prefix": "svc_massage"}')
    page.click("button:has-text('Create')")
    expect(page.locator("dd.filter code")).to_have_text('{"path":"data.service_id","prefix":"svc_massage"}')


def test_the_console_s_form_sets_endpoint_authentication_and_never_shows_the_secret(
    live: Live, page: Page
) -> None:
    log_in(page)
    page.goto("/console/subscriptions")
    page.click("summary:has-text('New subscription')")
    page.fill("input[name=url]", live.endpoint("gateway", Answer(200))[0])
    page.check("input[name=auth_type][value=oauth2_client_credentials]")
    page.fill("input[name=oauth_token_url]", live.endpoint("token", Answer(200))[0])
    page.fill("input[name=oauth_client_id]", "platform-1")
    page.fill("input[name=oauth_client_secret]", "console-secret-91c")
    page.click("button:has-text('Create')")
    expect(page.locator("dd.endpoint-auth")).to_contain_text("OAuth 2.0 client credentials as platform-1")
    assert "console-secret-91c" not in page.content()


def test_the_console_s_form_makes_a_broker_destination_for_operational_events_on_its_own_schedule(
    live: Live, page: Page
) -> None:
    """A NATS destination (credentials in its URL) for the service's own events, with its own
    retry waits: the subscription page shows the schedule and the URL with the credentials masked."""
    log_in(page)
    page.goto("/console/subscriptions")
    page.click("summary:has-text('New subscription')")
    page.fill("input[name=url]", "nats://ops:nats-pw-31@127.0.0.1:4222?subject=usp.ops")
    page.fill("input[name=event_types]", "subscription.* delivery.dead")
    page.fill("input[name=retry_delays]", "5, 30, 300")
    page.fill("input[name=max_age]", "2h")
    page.click("button:has-text('Create')")
    expect(page.locator("dd.retry-schedule")).to_have_text(
        "its own: waits 5 s, 30 s, 300 s; no try after 7200 s"
    )
    expect(page.locator("dl.facts")).to_contain_text("nats://***@127.0.0.1:4222?subject=usp.ops")
    assert "nats-pw-31" not in page.content()
    subscription_id = page.locator("h1 small").inner_text()
    with Session(live.engine) as session:
        made = session.get(Subscription, subscription_id)
        assert made is not None
        assert json.loads(made.event_types) == ["subscription.*", "delivery.dead"]
