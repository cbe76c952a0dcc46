"""``POST /services/feed/profiles``: fetch a real profile document over HTTP and subscribe it."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response

from tests.dispatcher.conftest import ADMIN, MakeClient, Serve
from tests.dispatcher.support import assert_problem
from usp_dispatcher.webhooks.profiles import MAX_PROFILE_BYTES

PATH = "/services/feed/profiles"


class ProfileHost:
    """A platform's web server: serves its profile document and counts the fetches."""

    def __init__(self) -> None:
        self.fetches: list[str] = []
        self.document: dict[str, Any] = {}
        self.app = FastAPI()
        self.app.add_api_route("/{name}", self._serve)

    async def _serve(self, name: str, request: Request) -> Response:
        self.fetches.append(name)
        hook = f"{request.base_url}hooks/usp"
        if name == "profile.json":
            return JSONResponse({"name": "Scheduling agent", "webhook_url": hook} | self.document)
        if name == "moved.json":
            return RedirectResponse("/profile.json", status_code=302)
        if name == "huge.json":
            return JSONResponse({"webhook_url": hook, "padding": "x" * MAX_PROFILE_BYTES})
        if name == "nohook.json":
            return JSONResponse({"name": "no webhooks here"})
        if name == "text.json":
            return PlainTextResponse("webhook_url=" + hook)
        if name == "private-hook.json":
            return JSONResponse({"webhook_url": "http://10.1.2.3/hooks/usp"})
        return JSONResponse({"error": "no such file"}, status_code=404)


@pytest.fixture
def host(serve: Serve) -> tuple[ProfileHost, str]:
    platform = ProfileHost()
    return platform, serve(platform.app)


def test_registers_the_profile_webhook(make_client: MakeClient, host: tuple[ProfileHost, str]) -> None:
    platform, base = host
    platform.document = {"webhook_transport": "jsonrpc", "webhook_event_types": ["booking.*"]}
    client = make_client(allow_private_targets=True)
    response = client.post(PATH, json={"profile": f"{base}/profile.json"}, headers=ADMIN)
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["url"] == f"{base}/hooks/usp"
    assert created["transport"] == "jsonrpc"
    assert created["event_types"] == ["booking.*"]
    assert created["platform_profile"] == f"{base}/profile.json"
    assert created["state"] == "active"
    assert platform.fetches == ["profile.json"]

    # The platform changes its profile and registers again: the same subscription is updated.
    platform.document = {"webhook_event_types": ["waitlist.*", "booking.confirmed"]}
    again = client.post(PATH, json={"profile": f"{base}/profile.json"}, headers=ADMIN)
    assert again.status_code == 200, again.text
    updated = again.json()
    assert updated["id"] == created["id"]
    assert updated["transport"] == "rest"
    assert updated["event_types"] == ["waitlist.*", "booking.confirmed"]
    assert platform.fetches == ["profile.json", "profile.json"]
    listed = client.get("/services/feed/subscriptions", headers=ADMIN).json()["items"]
    assert [s["id"] for s in listed] == [created["id"]]

    # The platform moves its webhook: a new subscription, and the old URL stops receiving events.
    platform.document = {"webhook_url": f"{base}/hooks/v2"}
    moved = client.post(PATH, json={"profile": f"{base}/profile.json"}, headers=ADMIN)
    assert moved.status_code == 201, moved.text
    states = {
        s["url"]: s["state"]
        for s in client.get("/services/feed/subscriptions", headers=ADMIN).json()["items"]
    }
    assert states == {f"{base}/hooks/usp": "disabled", f"{base}/hooks/v2": "active"}


def test_private_profile_refused_without_fetching(
    make_client: MakeClient, host: tuple[ProfileHost, str]
) -> None:
    platform, base = host
    client = make_client(allow_private_targets=False)
    https_base = base.replace("http://", "https://")
    response = client.post(PATH, json={"profile": f"{https_base}/profile.json"}, headers=ADMIN)
    problem = assert_problem(response, 422, "target_refused")
    assert problem["target_reason"] == "private_address"
    assert "profile" in problem["detail"]
    assert platform.fetches == []
    assert client.get("/services/feed/subscriptions", headers=ADMIN).json()["items"] == []


def test_plain_http_profile_refused_outside_development(
    make_client: MakeClient, host: tuple[ProfileHost, str]
) -> None:
    platform, base = host
    client = make_client(allow_private_targets=False, private_target_allowlist=("127.0.0.0/8",))
    response = client.post(PATH, json={"profile": f"{base}/profile.json"}, headers=ADMIN)
    assert_problem(response, 422, "profile_not_https")
    assert platform.fetches == []


@pytest.mark.parametrize(
    ("document", "reason", "target_reason"),
    [
        ({"webhook_url": "ftp://127.0.0.1/hooks"}, "target_refused", "bad_scheme"),
        ({"webhook_url": "http://user:secret@127.0.0.1/hooks"}, "target_refused", "credentials_in_url"),
        ({"webhook_event_types": ["bookings.*"]}, "unknown_event_type", None),
        ({"webhook_event_types": "booking.*"}, "profile_bad_event_types", None),
        ({"webhook_transport": "smtp"}, "profile_bad_transport", None),
    ],
)
def test_profile_contents_are_checked(
    make_client: MakeClient,
    host: tuple[ProfileHost, str],
    document: dict[str, Any],
    reason: str,
    target_reason: str | None,
) -> None:
    platform, base = host
    platform.document = document
    client = make_client(allow_private_targets=True)
    problem = assert_problem(
        client.post(PATH, json={"profile": f"{base}/profile.json"}, headers=ADMIN), 422, reason
    )
    assert problem.get("target_reason") == target_reason
    assert "secret" not in problem["detail"]
    assert platform.fetches == ["profile.json"]
    assert client.get("/services/feed/subscriptions", headers=ADMIN).json()["items"] == []


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("moved.json", "profile_redirect"),
        ("huge.json", "profile_too_large"),
        ("nohook.json", "profile_without_webhook_url"),
        ("text.json", "profile_not_json"),
        ("missing.json", "profile_unavailable"),
    ],
)
def test_unusable_profiles_are_refused(
    make_client: MakeClient, host: tuple[ProfileHost, str], name: str, reason: str
) -> None:
    platform, base = host
    client = make_client(allow_private_targets=True)
    assert_problem(client.post(PATH, json={"profile": f"{base}/{name}"}, headers=ADMIN), 422, reason)
    assert platform.fetches == [name]  # fetched once; a redirect is not followed
    assert client.get("/services/feed/subscriptions", headers=ADMIN).json()["items"] == []


def test_unreachable_profile_is_refused(make_client: MakeClient) -> None:
    client = make_client(allow_private_targets=True)
    response = client.post(PATH, json={"profile": "http://127.0.0.1:9/profile.json"}, headers=ADMIN)
    assert_problem(response, 422, "profile_unreachable")
