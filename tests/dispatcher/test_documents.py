"""``fetch_document``: the one way the service reads a document from a URL someone gave it
(platform profiles, agents' key directories), against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gzip
import socket

import pytest
from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

from tests.dispatcher.conftest import Serve
from usp_core.ssrf import check_target
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.documents import fetch_document
from usp_dispatcher.errors import DocumentUnavailable

pytestmark = pytest.mark.anyio

MAX = 1024
SECONDS = 0.5
DOCUMENT = b'{"name": "agent"}'


def document_host() -> FastAPI:
    app = FastAPI()

    @app.get("/ok.json")
    async def ok() -> Response:
        return Response(DOCUMENT, media_type="application/json")

    @app.get("/moved.json")
    async def moved() -> Response:
        return RedirectResponse("/ok.json", status_code=302)

    @app.get("/gone.json")
    async def gone() -> Response:
        return Response(b"{}", status_code=404, media_type="application/json")

    @app.get("/gzip.json")
    async def compressed() -> Response:
        body = gzip.compress(DOCUMENT)
        return Response(body, media_type="application/json", headers={"Content-Encoding": "gzip"})

    @app.get("/huge.json")
    async def huge() -> Response:
        return Response(b"[" + b"0," * MAX + b"0]", media_type="application/json")

    @app.get("/slow.json")
    async def slow() -> Response:
        await asyncio.sleep(SECONDS * 4)
        return Response(DOCUMENT, media_type="application/json")

    return app


@pytest.fixture(scope="module")
def settings() -> Settings:
    return Settings(_env_file=None, allow_private_targets=True)


async def fetch(url: str, settings: Settings) -> bytes:
    target = await check_target(url, settings)
    document = await fetch_document(
        target, settings, accept="application/json", max_bytes=MAX, seconds=SECONDS
    )
    return document.body


async def test_a_200_answer_is_the_document(serve: Serve, settings: Settings) -> None:
    base = serve(document_host())
    assert await fetch(f"{base}/ok.json", settings) == DOCUMENT


@pytest.mark.parametrize(
    ("name", "failure", "status_code"),
    [
        ("moved.json", "redirect", 302),
        ("gone.json", "status", 404),
        ("gzip.json", "compressed", None),
        ("huge.json", "too_large", None),
        ("slow.json", "timeout", None),
    ],
)
async def test_every_other_answer_is_refused_with_its_reason(
    serve: Serve, settings: Settings, name: str, failure: str, status_code: int | None
) -> None:
    base = serve(document_host())
    with pytest.raises(DocumentUnavailable) as refused:
        await fetch(f"{base}/{name}", settings)
    assert (refused.value.failure, refused.value.status_code) == (failure, status_code)


async def test_nothing_listening_is_unreachable(settings: Settings) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again before the fetch: nothing listens there
    with pytest.raises(DocumentUnavailable) as refused:
        await fetch(f"http://127.0.0.1:{port}/ok.json", settings)
    assert refused.value.failure == "unreachable"
    assert refused.value.cause == "ConnectError"
