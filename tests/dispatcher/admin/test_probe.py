"""``usp-webhooks probe`` and ``POST /admin/probes``: the verification battery run from the API
(under uvicorn, the business's real key) against receivers on real servers; runs recorded and
listed; targets checked like subscriptions; one run per target at a time."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from typer.testing import CliRunner

from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN, MakeSettings, Serve
from tests.servers import running, serving
from tests.workers.endpoints import Answer
from usp_dispatcher import cli
from usp_dispatcher.api.app import create_app
from usp_receiver import JWKS, Verifier, WebhookReceiver
from usp_receiver.fastapi import webhook_router

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
PATH = "/webhooks/usp"


@pytest.fixture
def api(make_settings: MakeSettings, serve: Serve) -> str:
    return serve(create_app(make_settings()))


@pytest.fixture
def verifying(api: str) -> Iterator[str]:
    """A platform's endpoint built with the receiver library, trusting the business's JWKS."""
    jwks = JWKS.from_dict(httpx.get(api + "/.well-known/usp/jwks.json").json())
    app = FastAPI()
    app.include_router(webhook_router(WebhookReceiver(Verifier(jwks), lambda hook: None), path=PATH))
    with running(app) as base:
        yield base + PATH


def cli_probe(api: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli.app,
        ["probe", *args],
        env={"USP_ADMIN_URL": api, "USP_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "120"},
    )
    return result.exit_code, result.output


def test_a_verifying_endpoint_passes_and_the_run_is_recorded(api: str, verifying: str) -> None:
    code, output = cli_probe(api, verifying)
    assert code == 0, output
    assert "endpoint verifies signatures correctly" in output
    assert "WRONG" not in output
    [run] = httpx.get(api + "/admin/probes", headers=ADMIN).json()["items"]
    assert (run["target"], run["transport"], run["problems"]) == (verifying, "rest", 0)
    assert run["actor"].startswith("admin token, from 127.0.0.1")
    assert len(run["results"]) == 14
    assert {r["case"] for r in run["results"] if r["expected"] == "2xx"} == {
        "valid",
        "duplicate",
        "rotation_sig2",
    }


def test_an_endpoint_that_accepts_everything_fails_with_every_refusal_named(api: str) -> None:
    with serving(Answer(200)) as served:
        code, output = cli_probe(api, served.url + "/hook", "--json")
    assert code == 1
    run = json.loads(output)
    wrong = [r["case"] for r in run["results"] if not r["ok"]]
    assert len(wrong) == 11
    assert run["verdict"].startswith("11 problems: body_changed: accepted a body changed after signing")


def test_a_second_run_against_one_target_waits_and_refused_targets_are_refused(
    api: str, verifying: str
) -> None:
    first = httpx.post(api + "/admin/probes", json={"url": verifying}, headers=ADMIN, timeout=60)
    assert first.status_code == 201, first.text
    again = httpx.post(api + "/admin/probes", json={"url": verifying}, headers=ADMIN, timeout=60)
    assert again.status_code == 429
    assert again.json()["reason"] == "probe_rate_limited"
    assert 1 <= int(again.headers["retry-after"]) <= 10
    metadata = httpx.post(
        api + "/admin/probes", json={"url": "http://169.254.169.254/latest/meta-data"}, headers=ADMIN
    )
    assert (metadata.status_code, metadata.json()["reason"]) == (422, "target_refused")
    unauthenticated = httpx.post(api + "/admin/probes", json={"url": verifying})
    assert unauthenticated.status_code == 401


def test_a_subscription_is_probed_at_its_url_in_its_format(api: str) -> None:
    with serving(Answer(200)) as served:
        body = {"url": served.url + "/rpc", "transport": "jsonrpc"}
        created = httpx.post(api + "/services/feed/subscriptions", json=body, headers=ADMIN)
        assert created.status_code == 201, created.text
        code, output = cli_probe(api, "--subscription", created.json()["id"], "--json")
    run = json.loads(output)
    assert (run["target"], run["transport"]) == (served.url + "/rpc", "jsonrpc")
    assert code == 1, "it accepts everything"
