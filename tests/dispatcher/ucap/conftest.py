"""Fixtures for the UCAP content server: agents whose JWKS a real registry (uvicorn on 127.0.0.1)
serves OpenBotAuth-style, one URL per agent, and the API in this process with its demo content.

Every test runs on SQLite and PostgreSQL (``database_url`` of the dispatcher's conftest).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.dispatcher.conftest import MakeClient, Serve
from usp_dispatcher.access.signatures import web_bot_auth_headers
from usp_receiver import SigningKey

DIRECTORY_MEDIA_TYPE = "application/http-message-signatures-directory+json"


@dataclass
class Registry:
    """An OpenBotAuth-like registry: ``/jwks/<name>.json`` is one agent's key set."""

    url: str = ""
    keys: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    fetches: list[str] = field(default_factory=list)


@dataclass
class Agent:
    name: str
    key: SigningKey
    jwks_url: str

    def sign(self, method: str, url: str, body: bytes = b"", **options: Any) -> dict[str, str]:
        return web_bot_auth_headers(method, url, body, self.key, signature_agent=self.jwks_url, **options)


MakeAgent = Callable[[str], Agent]


@pytest.fixture
def registry(serve: Serve) -> Registry:
    state = Registry()

    async def jwks(request: Request) -> Response:
        name = request.path_params["name"]
        state.fetches.append(name)
        if name not in state.keys:
            return Response(status_code=404)
        return JSONResponse({"keys": state.keys[name]}, media_type=DIRECTORY_MEDIA_TYPE)

    state.url = serve(Starlette(routes=[Route("/jwks/{name}.json", jwks)]))
    return state


@pytest.fixture
def make_agent(registry: Registry) -> MakeAgent:
    def make(name: str) -> Agent:
        key = SigningKey.generate()
        registry.keys[name] = [dict(key.public.jwk)]
        return Agent(name, key, f"{registry.url}/jwks/{name}.json")

    return make


@pytest.fixture
def alice(make_agent: MakeAgent) -> Agent:
    return make_agent("alice")


@pytest.fixture
def api(make_client: MakeClient) -> TestClient:
    """The API (lifespan run: migrations, signing key, demo catalog and content)."""
    return make_client()


def signed(
    client: TestClient,
    agent: Agent,
    method: str,
    path: str,
    json_body: Any = None,
    headers: dict[str, str] | None = None,
) -> httpx2.Response:
    """One ``/v1`` call, signed by ``agent`` as OpenBotAuth's signer signs."""
    import json

    body = b"" if json_body is None else json.dumps(json_body).encode()
    url = str(client.base_url).rstrip("/") + path
    fields = agent.sign(method, url, body)
    return client.request(method, url, content=body, headers=fields | (headers or {}))
