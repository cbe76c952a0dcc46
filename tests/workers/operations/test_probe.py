"""The probe battery (``usp_workers.operations.probe``) against four receivers on a real server: the
receiver library's FastAPI integration (every answer right), one that accepts everything (every
refusal missing), one that never compares the digest to the body (exactly that case), and one
that answers 500 to a bad signature (refused, but for the wrong reason)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fastapi import FastAPI

from tests.servers import running
from tests.workers.endpoints import Answer, Receive, Scope, Send
from tests.workers.support import Endpoints
from usp_core.ssrf import check_target
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS, SigningKey, VerificationPolicy, Verifier, WebhookReceiver
from usp_receiver.fastapi import webhook_router
from usp_workers.engine.transport import make_client
from usp_workers.operations.probe import CASES, probe_endpoint, summary

pytestmark = pytest.mark.anyio

App = Callable[[Scope, Receive, Send], Awaitable[None]]
PATH = "/webhooks/usp"
NEGATIVE = {c.name for c in CASES if c.expect == "reject"}


def receiver(
    key: SigningKey, handled: list[str], path: str, policy: VerificationPolicy | None = None
) -> FastAPI:
    verifier = Verifier(JWKS([key.public]), policy=policy or VerificationPolicy())
    app = FastAPI()
    app.include_router(
        webhook_router(WebhookReceiver(verifier, lambda hook: handled.append(hook.event.event_id)))
    )
    return app


def answering_500_for_401(app: Any) -> App:
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def rewrite(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                message = {**message, "status": 500}
            await send(message)

        await app(scope, receive, rewrite)

    return wrapped


async def run(url: str, key: SigningKey) -> dict[str, tuple[bool, int | None, str]]:
    settings = Settings(_env_file=None, database_url="sqlite://", allow_private_targets=True)
    target = await check_target(url, settings)
    async with make_client(settings) as client:
        results = await probe_endpoint(client, target, [key])
    return {r.case.name: (r.ok, r.status, r.finding) for r in results}


async def test_the_receiver_library_answers_every_case_right() -> None:
    key = SigningKey.generate()
    handled: list[str] = []
    with running(receiver(key, handled, PATH)) as base:
        found = await run(base + PATH, key)
    assert all(ok for ok, _, _ in found.values()), found
    assert found["valid"][1] == 200
    assert found["rotation_sig2"][1] == 200, "the old key still verifies while sig1's key is unknown"
    assert {found[name][1] for name in NEGATIVE} <= {400, 401}, found
    assert handled == [], "probe events are verified and answered, never handed to the handler"


async def test_a_receiver_that_accepts_everything_has_every_refusal_flagged(endpoints: Endpoints) -> None:
    found = await run(endpoints.add("anything", Answer(200)), SigningKey.generate())
    wrong = {name for name, (ok, _, _) in found.items() if not ok}
    assert wrong == NEGATIVE
    assert found["unsigned"][2] == "accepted no signature at all"


async def test_a_receiver_that_ignores_the_digest_is_flagged_for_exactly_that() -> None:
    key = SigningKey.generate()
    with running(receiver(key, [], PATH, VerificationPolicy(require_digest=False))) as base:
        found = await run(base + PATH, key)
    assert {name for name, (ok, _, _) in found.items() if not ok} == {"digest_mismatch"}


async def test_a_500_for_a_bad_signature_is_a_refusal_for_the_wrong_reason() -> None:
    key = SigningKey.generate()
    with running(answering_500_for_401(receiver(key, [], PATH))) as base:
        found = await run(base + PATH, key)
    wrong = {name for name, (ok, _, _) in found.items() if not ok}
    assert "unknown_key" in wrong
    assert found["unknown_key"][1] == 500
    assert "wrong reason" in found["unknown_key"][2]
    assert found["valid"][0]


def test_the_verdict_line() -> None:
    assert summary([]) == "endpoint verifies signatures correctly"
