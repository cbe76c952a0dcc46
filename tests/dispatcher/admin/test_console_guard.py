"""Every console and portal route refuses without a session, whatever it is: pages send to the
login (or the portal's expired-link page), actions answer 401, and nothing answers 2xx. Found
by walking the two routers, so a route added later is covered as well."""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from tests.dispatcher.conftest import ADMIN
from usp_dispatcher import console

OPEN = {"/console/login", "/portal/enter", "/portal/expired"}

ON_SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def guarded() -> list[tuple[str, str]]:
    routes = [r for r in (*console.router.routes, *console.portal.router.routes) if isinstance(r, APIRoute)]
    return [
        (method, route.path.replace("{", "x_").replace("}", ""))
        for route in routes
        if route.path not in OPEN
        for method in sorted(route.methods or ())
    ]


@ON_SQLITE
def test_no_console_or_portal_route_answers_without_a_session(client: TestClient) -> None:
    routes = guarded()
    assert len(routes) >= 20, routes
    assert ("POST", "/console/subscriptions/x_subscription_id/recover") in routes
    assert ("POST", "/portal/subscriptions/x_subscription_id/test") in routes
    for method, path in routes:
        answer = client.request(method, path, data={"csrf": "x"}, headers=ADMIN, follow_redirects=False)
        if method == "GET":
            assert answer.status_code == 303, (method, path, answer.status_code)
            login = "/console/login" if path.startswith("/console") else "/portal/expired"
            assert answer.headers["location"] == login, (method, path)
        else:
            assert answer.status_code == 401, (method, path, answer.status_code)
            assert answer.json()["reason"] == "session_required"


@ON_SQLITE
def test_an_admin_bearer_token_opens_no_console_page(client: TestClient) -> None:
    """The console takes its own session, never the API's bearer token (a token in a browser's
    Authorization header would be a CSRF vector)."""
    answer = client.get("/console/events", headers=ADMIN, follow_redirects=False)
    assert (answer.status_code, answer.headers["location"]) == (303, "/console/login")
    assert answer.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


@pytest.mark.parametrize("name", ["snippets/python.py.j2", "snippets/node.mjs.j2"])
def test_snippet_values_are_escaped_though_the_templates_are_not_html(name: str) -> None:
    """Included in a page, a snippet's values (a subscription's URL) must not become markup."""
    from usp_dispatcher.console.web import templates

    class Sub:
        url = 'https://platform.example/hook?x="</pre><img src=x onerror=alert(1)>'

    text = templates.get_template(name).render(
        jwks_url="https://b.example/jwks", s=Sub(), path="/hook", insecure=False
    )
    assert "<img" not in text
    assert "&lt;img" in text
