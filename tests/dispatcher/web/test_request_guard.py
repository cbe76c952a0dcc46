"""No string a client sends can crash the REST API: NUL is refused at the edge (422), and a
Hypothesis fuzz of every public and admin route (their OpenAPI parameters and bodies filled with
arbitrary strings) never gets a 5xx or a traceback, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.dispatcher.conftest import ADMIN, MakeClient, MakeSettings
from tests.dispatcher.support import assert_problem
from usp_dispatcher.api.app import create_app
from usp_dispatcher.text import MAX_JSON_DEPTH, contains_nul, json_too_deep
from usp_dispatcher.web.request_guard import MAX_BODY_BYTES

JSON_TYPE = {"Content-Type": "application/json"}


async def _no_dns(host: str, port: int) -> list[str]:
    """The fuzz must not reach the network: every host name is unresolvable."""
    raise OSError("no name resolution in this test")


@pytest.fixture
def guarded(make_client: MakeClient, make_settings: MakeSettings) -> TestClient:
    """The app with private targets refused and no DNS (a subscription or profile URL the fuzz
    makes up is refused before anything is fetched)."""
    app = create_app(make_settings(allow_private_targets=False))
    app.state.target_resolver = _no_dns
    client = make_client(app=app)
    client.follow_redirects = False
    return client


# ------------------------------------------------------------------------------- the NUL rule


@pytest.mark.parametrize(
    ("method", "url", "body", "where"),
    [
        ("GET", "/services/availability?service_id=%00", None, "the query"),
        ("GET", "/services/availability?service_id=svc&start_date=2026-01-01%00", None, "the query"),
        ("GET", "/services/bookings/bkg_%00", None, "the path"),
        (
            "POST",
            "/services/bookings",
            {"service_id": "svc\x00", "slot_id": "s", "buyer": {}},
            "the JSON body",
        ),
        ("POST", "/services/feed/subscriptions", {"url": "https://h.example/", "x\x00": 1}, "the JSON body"),
        ("POST", "/events", {"event": "booking.created", "data": {"a": [[["\x00"]]]}}, "the JSON body"),
    ],
)
def test_a_nul_anywhere_is_a_422_problem(
    client: TestClient, method: str, url: str, body: Any, where: str
) -> None:
    content = None if body is None else json.dumps(body).encode()
    response = client.request(method, url, content=content, headers=ADMIN)
    problem = assert_problem(response, 422, "invalid_request")
    assert problem["detail"] == f"Strings may not contain the NUL character (U+0000): {where} has one."


def test_an_escaped_backslash_before_u0000_is_not_a_nul(client: TestClient) -> None:
    """``"\\\\u0000"`` is a backslash and five characters: an ordinary (unknown) service id."""
    response = client.get("/services/availability", params={"service_id": "\\u0000"})
    assert response.status_code == 422  # the dates are missing: FastAPI's own validation
    assert "NUL" not in response.json()["detail"]
    body = json.dumps({"url": "https://h.example/\\u0000", "event_types": ["\\u0000"]})
    response = client.post("/services/feed/subscriptions", content=body, headers=ADMIN)
    assert "NUL" not in response.json()["detail"]


def test_utf16_json_is_checked_too(client: TestClient) -> None:
    """``json.loads`` (so FastAPI) reads UTF-16 JSON; its NUL escapes must not slip through."""
    body = json.dumps({"service_id": "svc\x00"}).encode("utf-16")
    response = client.post("/services/bookings", content=body, headers=ADMIN)
    assert_problem(response, 422, "invalid_request")


#: 100,000 levels: json.loads raises RecursionError, or crashes the process in a thread whose C
#: stack runs out (a segmentation fault in a worker thread, seen on these machines).
DEEP = 100_000
DEEP_BODIES = {
    "arrays": b"[" * DEEP + b"]" * DEEP,
    "objects": b'{"a":' * DEEP + b"1" + b"}" * DEEP,
    "in a JSON-RPC message": b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
    + b'{"a":' * DEEP
    + b"1"
    + b"}" * DEEP
    + b"}",
}
JSON_ROUTES = [
    "/events",
    "/events/batch",
    "/services/feed/subscriptions",
    "/services/bookings",
    "/admin/subscriptions",
    "/v1/catalog/search",
]


@pytest.mark.parametrize("shape", DEEP_BODIES)
def test_json_nested_too_deep_is_malformed_json_on_every_json_route(client: TestClient, shape: str) -> None:
    for route in JSON_ROUTES:
        response = client.post(route, content=DEEP_BODIES[shape], headers=ADMIN | JSON_TYPE)
        problem = assert_problem(response, 400, "malformed_json")
        assert problem["detail"] == f"The JSON is nested deeper than {MAX_JSON_DEPTH} levels."


@pytest.mark.parametrize("shape", DEEP_BODIES)
@pytest.mark.parametrize("credential", [None, "Bearer test-admin-token-7c1f0e", "Bearer wrong"])
def test_json_nested_too_deep_is_a_parse_error_on_mcp(
    client: TestClient, shape: str, credential: str | None
) -> None:
    headers = {"Accept": "application/json, text/event-stream", "Host": "127.0.0.1"} | JSON_TYPE
    if credential is not None:
        headers["Authorization"] = credential
    response = client.post("/mcp", content=DEEP_BODIES[shape], headers=headers)
    if credential == "Bearer wrong":
        assert response.status_code == 401  # refused before the body is read as JSON-RPC
        assert response.json()["id"] is None
        return
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700
    assert response.json()["error"]["data"]["content"].startswith("The JSON is nested deeper")


def test_the_deepest_json_allowed_is_read_as_usual(client: TestClient) -> None:
    """At the limit a body is an ordinary (here: invalid) event, not a nesting refusal."""
    nested: Any = 1
    for _ in range(MAX_JSON_DEPTH - 2):
        nested = {"a": nested}
    body = json.dumps({"event": "booking.created", "data": nested}).encode()
    assert not json_too_deep(body)
    response = client.post("/events", content=body, headers=ADMIN | JSON_TYPE)
    assert response.status_code == 422, response.text
    assert json_too_deep(b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1))
    assert not json_too_deep(b'["' + b"[" * 1000 + b'"]')  # brackets in a string do not nest


def test_a_body_over_the_cap_is_413_on_every_route(client: TestClient) -> None:
    response = client.post("/services/bookings", content=b" " * (MAX_BODY_BYTES + 1), headers=ADMIN)
    assert_problem(response, 413, "payload_too_large")


def test_the_mcp_endpoint_answers_for_itself(client: TestClient) -> None:
    """A NUL in a ``tools/call`` over ``/mcp`` is the MCP layer's ``-32602`` (JSON-RPC), not a problem."""
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "Host": "127.0.0.1",
    }
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t\x00", "version": "1"},
        },
    }
    response = client.post("/mcp", content=json.dumps(message), headers=headers)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert '"result"' in response.text


def test_contains_nul_sees_keys_and_any_depth() -> None:
    deep: Any = "\x00"
    for _ in range(5000):
        deep = [deep]
    assert contains_nul(deep)
    assert contains_nul({"\x00": 1})
    assert not contains_nul({"a": [1, 2.5, None, True, {"b": "c"}]})


# ------------------------------------------------------------------------------- the fuzz

_TEXT = st.one_of(
    st.text(max_size=30),
    st.text(max_size=10).map(lambda s: s + "\x00"),
    st.text(alphabet="aé€\x00\U0001f600 /?#%", min_size=100, max_size=3000),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)


def _from_schema(
    schema: Mapping[str, Any], components: Mapping[str, Any], depth: int = 0
) -> st.SearchStrategy[Any]:
    """Values shaped by an OpenAPI schema (so they get past the first validation and reach the
    database), with arbitrary strings at every string and, now and then, a value of any shape."""
    if depth > 6:
        return _JSON
    if "$ref" in schema:
        return _from_schema(components[schema["$ref"].rsplit("/", 1)[-1]], components, depth + 1)
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema["oneOf"]
        return st.one_of([_from_schema(option, components, depth + 1) for option in options])
    shaped: st.SearchStrategy[Any]
    kind = schema.get("type")
    if "enum" in schema:
        shaped = st.sampled_from(schema["enum"])
    elif kind == "string" and schema.get("format") == "date":
        shaped = st.dates().map(str)
    elif kind == "string" and schema.get("format") == "date-time":
        shaped = st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat())
    elif kind == "string":
        shaped = _TEXT
    elif kind == "integer":
        shaped = st.integers(-(2**70), 2**70)
    elif kind == "number":
        shaped = st.floats(allow_nan=False)
    elif kind == "boolean":
        shaped = st.booleans()
    elif kind == "null":
        shaped = st.none()
    elif kind == "array":
        shaped = st.lists(_from_schema(schema.get("items", {}), components, depth + 1), max_size=3)
    elif kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        shaped = st.fixed_dictionaries(
            {
                name: _from_schema(s, components, depth + 1)
                for name, s in properties.items()
                if name in required
            },
            optional={
                name: _from_schema(s, components, depth + 1)
                for name, s in properties.items()
                if name not in required
            },
        )
    else:
        shaped = _JSON
    return st.one_of(_TEXT, shaped, _JSON) if depth == 0 else st.one_of(shaped, shaped, _TEXT)


def _header_safe(value: str) -> bool:
    """What an HTTP client can send at all (the fuzz is about strings that reach the app)."""
    return value.isascii() and value.isprintable() and value == value.strip()


def _operations(schema: Mapping[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    ]


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_string_makes_a_5xx_or_a_traceback(guarded: TestClient, data: st.DataObject) -> None:
    openapi = guarded.app.openapi()  # type: ignore[attr-defined]
    components = openapi.get("components", {}).get("schemas", {})
    method, path, operation = data.draw(st.sampled_from(_operations(openapi)), label="operation")
    query: dict[str, str] = {}
    headers = dict(ADMIN)
    for parameter in operation.get("parameters", ()):
        value = data.draw(
            st.none() | _from_schema(parameter.get("schema", {}), components, 1), label=parameter["name"]
        )
        if parameter["in"] == "path":
            text = value if isinstance(value, str) else json.dumps(value)
            path = path.replace("{" + parameter["name"] + "}", quote(text, safe=""))
        elif parameter["in"] == "query" and value is not None:
            query[parameter["name"]] = value if isinstance(value, str) else json.dumps(value)
        elif (
            parameter["in"] == "header" and isinstance(value, str) and value.isascii() and value.isprintable()
        ):
            headers[parameter["name"]] = value
    content = None
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if body is not None:
        content = json.dumps(data.draw(_from_schema(body["schema"], components), label="body"))
    response = guarded.request(method, path, params=query, content=content, headers=headers)
    event(f"{response.status_code} {method} {operation.get('operationId', path)}")
    assert response.status_code < 500, (response.status_code, response.text)
    assert "Traceback" not in response.text
    assert 'File "' not in response.text
