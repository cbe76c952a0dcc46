"""Small helpers the dispatcher tests share (fixtures live in ``conftest.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tests.dispatcher.conftest import ADMIN
from tests.schemas.samples import sample
from usp_schemas import new_event_id

PROBLEM_TYPE = "urn:usp-webhooks:problem:"


class Response(Protocol):
    """What the tests read from a response (Starlette's TestClient and httpx both fit)."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def json(self) -> Any: ...


def assert_problem(response: Response, status: int, reason: str) -> dict[str, Any]:
    """The response is an RFC 9457 problem with this status and reason; returns its body."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = response.json()
    assert problem["status"] == status
    assert problem["reason"] == reason
    assert problem["type"] == PROBLEM_TYPE + reason
    for member in ("title", "detail"):
        assert isinstance(problem[member], str)
        assert problem[member], f"empty {member}"
    return problem


def event(event_type: str, **changes: Any) -> dict[str, Any]:
    """A valid event body of ``event_type`` with a fresh event_id."""
    body = sample(event_type) | {"event_id": new_event_id()}
    body.update(changes)
    return body


def subscribe(client: Any, url: str, event_types: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """Create a subscription through the API (must succeed); returns its JSON."""
    body: dict[str, Any] = {"url": url, **extra}
    if event_types is not None:
        body["event_types"] = event_types
    response = client.post("/services/feed/subscriptions", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created
