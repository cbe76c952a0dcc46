"""The platform portal (``/portal``) in a real browser, for two platforms at once, against the
whole service on PostgreSQL: each sees only its own subscriptions, deliveries and events, and
the verification snippets it shows (Python with this project's receiver library; Node.js with
the npm ``http-message-signatures`` package, installed by ``.ci/run`` from ``tests/node``) are
copied off the page, run, and verify a real delivery sent by the portal's "send test event".
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.dispatcher.admin.browser import screenshot
from tests.dispatcher.admin.live import Live
from tests.dispatcher.conftest import ADMIN
from tests.nodejs import RECEIVER_JS, build_receiver_js
from tests.servers import free_port
from usp_core import db
from usp_dispatcher import access
from usp_receiver import SigningKey, sign_request

pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

ACME = "https://acme.example/.well-known/usp-profile"
GLOBEX = "https://globex.example/.well-known/usp-profile"


def subscribe(live: Live, url: str, profile: str) -> str:
    response = httpx.post(
        live.base + "/services/feed/subscriptions",
        json={"url": url, "platform_profile": profile},
        headers=ADMIN,
    )
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


class Snippet:
    """A snippet copied off the portal, running as its own process on ``port``."""

    def __init__(self, command: list[str], folder: Path, port: int) -> None:
        self.log = folder / "output.log"
        self.port = port
        self._sink = self.log.open("wb")
        self.process = subprocess.Popen(
            command,
            cwd=folder,
            env={**os.environ, "PORT": str(port)},
            stdout=self._sink,
            stderr=subprocess.STDOUT,
        )

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)
        self._sink.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_listening(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the snippet exited:\n{self.output()}")
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        pytest.fail(f"the snippet never listened:\n{self.output()}")

    def wait_printed(self, text: str) -> None:
        deadline = time.monotonic() + 30
        while text not in self.output():
            if time.monotonic() > deadline:
                pytest.fail(f"the snippet never printed {text}:\n{self.output()}")
            time.sleep(0.1)


@contextmanager
def running(command: list[str], folder: Path, port: int) -> Iterator[Snippet]:
    snippet = Snippet(command, folder, port)
    try:
        snippet.wait_listening()
        yield snippet
    finally:
        snippet.stop()


def enter(live: Live, context: BrowserContext, profile: str) -> Page:
    link = live.ok("portal-link", profile).splitlines()[0]
    assert link.startswith(live.base + "/portal/enter?token=")
    page = context.new_page()
    page.goto(link)
    expect(page).to_have_url(f"{live.base}/portal")
    return page


def send_test_event(page: Page) -> str:
    page.select_option("select[name=event_type]", "booking.confirmed")
    page.click("button:has-text('Send test event')")
    status = page.get_by_role("status")
    expect(status).to_contain_text("sent to this subscription")
    found = re.search(r"evt_[0-9a-f]{32}", status.inner_text())
    assert found
    return found.group(0)


def hear_live(page: Page, listener: Snippet) -> str:
    """Send test events until the live listener prints one (the first may go out before its
    stream is attached: pushes start from there); that event's id."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if listener.process.poll() is not None:
            pytest.fail(f"the MCP snippet exited:\n{listener.output()}")
        sent = send_test_event(page)
        for _ in range(30):
            if f"booking.confirmed {sent} signed by" in listener.output():
                return sent
            time.sleep(0.1)
    pytest.fail(f"the MCP snippet heard nothing:\n{listener.output()}")


def refused_without_a_valid_signature(url: str) -> None:
    body = b'{"event":"booking.confirmed","event_id":"evt_forged"}'
    headers = {"Content-Type": "application/json"}
    assert httpx.post(url, content=body, headers=headers).status_code == 401, "unsigned"
    stranger = SigningKey.generate()
    signed = headers | sign_request("POST", url, headers, body, [stranger])
    assert httpx.post(url, content=body, headers=signed).status_code == 401, "signed by a key not in the JWKS"


def test_each_platform_sees_only_its_own_and_both_snippets_verify_a_real_delivery(
    live: Live, browser: Browser, tmp_path: Path
) -> None:

    port_a, port_b = free_port(), free_port()
    url_a, url_b = f"http://127.0.0.1:{port_a}/webhooks/usp", f"http://127.0.0.1:{port_b}/hooks/usp"
    sub_a, sub_b = subscribe(live, url_a, ACME), subscribe(live, url_b, GLOBEX)
    acme = browser.new_context(base_url=live.base)
    globex = browser.new_context(base_url=live.base)
    for context in (acme, globex):
        context.set_default_timeout(20_000)

    # Acme: its one subscription; the Python snippet, run as it is shown, verifies a test event.
    page_a = enter(live, acme, ACME)
    expect(page_a.locator("table.subscriptions tbody tr")).to_have_count(1)
    page_a.click(f"text={sub_a}")
    (python := tmp_path / "python").mkdir()
    (python / "receiver.py").write_text(page_a.locator("#snippet-python").inner_text())
    uvicorn = [sys.executable, "-m", "uvicorn", "receiver:app", "--host", "127.0.0.1", "--port", str(port_a)]
    with running(uvicorn, python, port_a) as receiver_a:
        sent_a = send_test_event(page_a)
        receiver_a.wait_printed(f"booking.confirmed {sent_a} signed by")
        expect(page_a.locator(f"tr[data-event={sent_a}] .status-succeeded").first).to_be_visible()
        refused_without_a_valid_signature(url_a)

        # The portal's probe: the snippet, as shown, verifies everything it should.
        page_a.once("dialog", lambda dialog: dialog.accept())
        page_a.click("button:has-text('Probe this endpoint')")
        expect(page_a.locator(".verdict")).to_have_text("endpoint verifies signatures correctly")
        expect(page_a.locator("table.probe tbody tr.ok")).to_have_count(14)

        # A replay of its own event reaches it again; the snippet's dedupe handles it once.
        page_a.goto(f"/portal/events/{sent_a}")
        page_a.once("dialog", lambda dialog: dialog.accept())
        page_a.click("button:has-text('Replay')")
        expect(page_a).to_have_url(f"{live.base}/portal/subscriptions/{sub_a}")
        expect(page_a.locator(f"tr[data-event={sent_a}] td:nth-child(3) .status-succeeded")).to_have_count(2)
        screenshot(page_a, "portal.png", tmp_path)
    assert receiver_a.output().count(sent_a) == 1, "delivered twice, handled once"

    # The MCP snippet (2026-07-28, shown before the 2025 one), with an API key of Acme's: it hears
    # a test event live, verified against the published keys.
    page_a.goto(f"/portal/subscriptions/{sub_a}")
    snippets = page_a.locator("pre.snippet")
    ids = [snippets.nth(n).get_attribute("id") for n in range(snippets.count())]
    assert ids.index("snippet-mcp") < ids.index("snippet-mcp-legacy")
    with db.session(live.engine) as session:
        key = access.issue_api_key(session, "acme", profile=ACME)
    (mcp := tmp_path / "mcp").mkdir()
    (mcp / "live.py").write_text(page_a.locator("#snippet-mcp").inner_text().replace("YOUR_API_KEY", key))
    listener = Snippet([sys.executable, "live.py"], mcp, 0)
    try:
        heard = hear_live(page_a, listener)
    finally:
        listener.stop()
    assert listener.output().count(heard) == 1

    # Globex: the Node.js snippet, with our npm package (receiver-js/, as `npm install` would lay
    # it out), verifies its own test event.
    build_receiver_js()
    page_b = enter(live, globex, GLOBEX)
    page_b.click(f"text={sub_b}")
    (node := tmp_path / "node").mkdir()
    (node / "receiver.mjs").write_text(page_b.locator("#snippet-node").inner_text())
    (node / "node_modules" / "@usp-webhooks").mkdir(parents=True)
    (node / "node_modules" / "@usp-webhooks" / "receiver").symlink_to(RECEIVER_JS)
    with running(["node", "receiver.mjs"], node, port_b) as receiver_b:
        sent_b = send_test_event(page_b)
        receiver_b.wait_printed(f"booking.confirmed {sent_b}")
        expect(page_b.locator(f"tr[data-event={sent_b}] .status-succeeded").first).to_be_visible()
        refused_without_a_valid_signature(url_b)

    # Neither sees, sends to or replays into the other's.
    page_a.goto("/portal")
    for foreign in (sub_b, sent_b, url_b):
        assert foreign not in page_a.content()
    page_b.goto("/portal")
    for foreign in (sub_a, sent_a, url_a):
        assert foreign not in page_b.content()
    for path in (f"/portal/subscriptions/{sub_b}", f"/portal/events/{sent_b}"):
        page_a.goto(path)
        expect(page_a.get_by_role("alert")).to_contain_text("Not found among your subscriptions")
    page_a.goto(f"/portal/subscriptions/{sub_a}")
    csrf = page_a.locator("input[name=csrf]").first.input_value()
    for path, form in (
        (f"/portal/subscriptions/{sub_b}/test", {"event_type": "booking.confirmed"}),
        (f"/portal/events/{sent_b}/replay", {"subscription_id": sub_b}),
        (f"/portal/events/{sent_b}/replay", {"subscription_id": sub_a}),  # Globex's booking
    ):
        answer = acme.request.post(path, form={"csrf": csrf, **form}, max_redirects=0)
        assert answer.status in (404, 409), (path, form, answer.status)
    assert page_a.context.cookies()[0]["httpOnly"]

    page_a.set_viewport_size({"width": 375, "height": 740})  # a phone
    for path in ("/portal", f"/portal/subscriptions/{sub_a}", f"/portal/events/{sent_a}"):
        page_a.goto(path)
        overflow = page_a.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{path} is {overflow} px wider than the screen"


def test_a_forged_or_missing_link_opens_nothing(live: Live, browser: Browser) -> None:
    context = browser.new_context(base_url=live.base)
    page = context.new_page()
    page.goto("/portal/enter?token=1.forged.YQ.00")
    expect(page.get_by_role("alert")).to_contain_text("expired or is not valid")
    assert context.cookies() == []
    page.goto("/portal")
    expect(page).to_have_url(f"{live.base}/portal/expired")
    console_session = live.ok("portal-link", ACME).splitlines()[0].split("token=")[1]
    page.context.add_cookies(
        [{"name": "usp_console", "value": console_session, "url": live.base + "/console"}]
    )
    page.goto("/console/events")
    expect(page).to_have_url(f"{live.base}/console/login")  # a portal link is no console session
