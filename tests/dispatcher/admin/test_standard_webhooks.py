"""Standard Webhooks signatures beside RFC 9421, end to end: a subscription asks for them, the
worker signs real deliveries both ways, and other people's libraries verify what arrived: the
``standardwebhooks`` package from PyPI here, the ``standardwebhooks`` and ``svix`` npm packages
under Node (``tests/node/standard_webhooks.test.mjs``), before and during a secret rotation; a
tampered body and a stale timestamp are refused by each."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlmodel import Session
from standardwebhooks import Webhook, WebhookVerificationError

from tests.dispatcher.admin.live import SECRETS_KEY, Live, event_id_in, wait_until
from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN
from tests.nodejs import node_test
from tests.workers.endpoints import Answer, Seen
from usp_dispatcher.cli.config import Settings
from usp_receiver import Verifier, WebhookReceiver, standard_webhooks
from usp_receiver.fastapi import webhook_router
from usp_receiver.standard_webhooks import StandardWebhooksVerifier
from usp_schemas import PROBE_HEADER
from usp_workers.engine.webhook_secrets import WebhookSecrets, seal, unseal
from usp_workers.operations import short_id
from usp_workers.storage.models import Subscription

PATH = "/services/feed/subscriptions"


def subscribe(live: Live, url: str, signatures: list[str]) -> dict[str, Any]:
    response = httpx.post(live.base + PATH, json={"url": url, "signatures": signatures}, headers=ADMIN)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def delivered(live: Live, path: str, count: int) -> list[Seen]:
    wait_until(lambda: len(live.hub.seen(path)) >= count, f"{count} deliveries", live)
    return live.hub.seen(path)


def test_standard_webhooks_deliveries_verify_in_three_libraries_through_a_rotation(
    live: Live, tmp_path: Path
) -> None:
    url, path = live.endpoint("standard", Answer(200))
    created = subscribe(live, url, ["rfc9421", "standard-webhooks", "standard-webhooks-v1a"])
    assert created["signatures"] == ["rfc9421", "standard-webhooks", "standard-webhooks-v1a"]
    old = created["webhook_secret"]
    public_key = created["webhook_public_key"]
    assert old.startswith("whsec_")
    assert public_key.startswith("whpk_")
    shown = httpx.get(f"{live.base}{PATH}/{created['id']}", headers=ADMIN).json()
    assert "webhook_secret" not in shown, "the secret is shown once"
    assert old not in json.dumps(shown)

    health = httpx.get(f"{live.base}/admin/subscriptions/{created['id']}", headers=ADMIN).json()
    assert health["signatures"] == created["signatures"]
    with httpx.Client(base_url=live.base) as browser:  # the console's page says so too
        browser.get("/console/login")
        assert browser.post("/console/login", data={"token": ADMIN_TOKEN}).status_code in (200, 303)
        page = browser.get(f"/console/subscriptions/{created['id']}").text
        assert "rfc9421, standard-webhooks, standard-webhooks-v1a" in page

    first_event = event_id_in(live.ok("trigger", "booking.confirmed"))
    (first,) = delivered(live, path, 1)
    assert first.headers["webhook-id"] == first_event
    assert abs(int(first.headers["webhook-timestamp"]) - time.time()) < 60
    assert [s.split(",")[0] for s in first.headers["webhook-signature"].split()] == ["v1", "v1a"]
    assert Webhook(old).verify(first.body, first.headers)["event_id"] == first_event
    assert standard_webhooks.verify(first.headers, first.body, public_keys=[public_key]) == first_event
    assert Verifier(live.jwks).verify("POST", url, first.headers, first.body), "RFC 9421 still signs"

    rotated = live.ok("subscriptions", "rotate-secret", short_id(created["id"]), "--overlap", "2h")
    (new,) = re.findall(r"whsec_\S+", rotated)
    assert new != old
    assert "the old one signs beside it for 2h" in rotated
    during = event_id_in(live.ok("trigger", "waitlist.offered"))
    second = delivered(live, path, 2)[1]
    assert second.headers["webhook-signature"].count("v1,") == 2, "both secrets sign during the overlap"
    for secret in (old, new):
        assert Webhook(secret).verify(second.body, second.headers)["event_id"] == during

    tampered = second.body.replace(b'"waitlist.offered"', b'"waitlist.expired"')
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(tampered, second.headers)
    stale = standard_webhooks.sign(during, int(time.time()) - 600, second.body, secrets=[new])
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(second.body, stale)
    with pytest.raises(WebhookVerificationError):
        Webhook(standard_webhooks.new_secret()).verify(second.body, second.headers)

    cases = [
        case("before the rotation", first, [old], first_event),
        case("during the overlap", second, [old, new], during),
        case("a tampered body", second, [new], during, body=tampered, refused=True),
        case("a stale timestamp", second, [new], during, headers=stale, refused=True),
    ]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    report = node_test("standard_webhooks.test.mjs", {"USP_SW_CASES": str(tmp_path / "cases.json")})
    assert "# pass 8" in report, report


def case(
    name: str,
    seen: Seen,
    secrets: list[str],
    event_id: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    refused: bool = False,
) -> dict[str, Any]:
    return {
        "name": name,
        "body": (body or seen.body).decode(),
        "headers": headers or {k: v for k, v in seen.headers.items() if k.startswith("webhook-")},
        "secrets": secrets,
        "event_id": event_id,
        "refused": refused,
    }


def test_rfc9421_is_never_dropped_and_the_secret_needs_a_sealing_key(live: Live) -> None:
    url, _ = live.endpoint("refusals", Answer(200))
    alone = httpx.post(
        live.base + PATH, json={"url": url, "signatures": ["standard-webhooks"]}, headers=ADMIN
    )
    assert (alone.status_code, alone.json()["reason"]) == (422, "rfc9421_required")
    unknown = httpx.post(live.base + PATH, json={"url": url, "signatures": ["rfc9421", "pgp"]}, headers=ADMIN)
    assert (unknown.status_code, unknown.json()["reason"]) == (422, "unknown_signature_scheme")
    plain = subscribe(live, url, ["rfc9421"])
    assert plain["signatures"] == ["rfc9421"]
    assert "webhook_secret" not in plain
    none = httpx.post(f"{live.base}{PATH}/{plain['id']}/secrets/rotate", headers=ADMIN)
    assert (none.status_code, none.json()["reason"]) == (409, "no_webhook_secret")
    refused = live.run("subscriptions", "rotate-secret", plain["id"])
    assert refused.exit_code == 1
    assert "409 no_webhook_secret" in refused.output


def test_the_probe_judges_a_receiver_that_verifies_standard_webhooks_alone(live: Live) -> None:
    """``usp-webhooks probe`` on a Standard Webhooks subscription: each case carries those
    headers too, wrong where the case is wrong (tampered, stale, wrong secret), so a receiver
    that verifies only Standard Webhooks gets the verdict a correct RFC 9421 receiver gets."""
    url, path = live.endpoint("standard-only", Answer(503))
    created = subscribe(live, url, ["rfc9421", "standard-webhooks"])
    verifier = StandardWebhooksVerifier(secrets=[created["webhook_secret"]])
    app = FastAPI()
    app.include_router(webhook_router(WebhookReceiver(verifier, lambda hook: None), path=path))
    live.hub.routes[path] = app

    output = live.ok("probe", "--subscription", created["id"])
    assert "endpoint verifies signatures correctly" in output, output
    answers = {seen.headers[PROBE_HEADER.lower()]: seen for seen in live.hub.seen(path)}
    assert "webhook-signature" in answers["valid"].headers
    assert "webhook-signature" not in answers["other_path"].headers, "an RFC 9421-only case"


def test_a_rotation_overlaps_as_the_signing_keys_do_unless_told(live: Live) -> None:
    url, _ = live.endpoint("overlap", Answer(200))
    created = subscribe(live, url, ["rfc9421", "standard-webhooks"])
    rotate = f"{live.base}{PATH}/{created['id']}/secrets/rotate"
    assert httpx.post(rotate, headers=ADMIN).status_code == 200
    with Session(live.engine) as session:
        stored = session.get(Subscription, created["id"])
        assert stored is not None
        assert stored.webhook_secrets is not None
        secrets = unseal(stored.webhook_secrets, SecretStr(SECRETS_KEY), stored.id)
    new, old = secrets.hmac
    assert new.until is None
    assert old.value == created["webhook_secret"]
    assert old.until is not None
    left = (old.until - datetime.now(UTC)).total_seconds()
    assert (
        Settings(_env_file=None).key_overlap_seconds - 60
        < left
        <= Settings(_env_file=None).key_overlap_seconds
    )
    short = httpx.post(rotate, json={"overlap_seconds": 0}, headers=ADMIN).json()["webhook_secret"]
    with Session(live.engine) as session:
        stored = session.get(Subscription, created["id"])
        assert stored is not None
        assert stored.webhook_secrets is not None
        now_signing = unseal(stored.webhook_secrets, SecretStr(SECRETS_KEY), stored.id).signing(
            datetime.now(UTC)
        )
    assert now_signing == ([short], []), "overlap 0: the old secrets stop at once"


def test_a_rotation_the_secrets_key_cannot_open_is_a_409_not_a_500(live: Live) -> None:
    """The service's USP_SECRETS_KEY changed since the secrets were sealed: rotating them cannot
    work, and says why, instead of failing inside (and nothing is written)."""
    url, _ = live.endpoint("resealed", Answer(200))
    created = subscribe(live, url, ["rfc9421", "standard-webhooks"])
    other = SecretStr("another-key-" + "1" * 32)
    with Session(live.engine) as session:
        stored = session.get(Subscription, created["id"])
        assert stored is not None
        sealed = seal(WebhookSecrets.new(("rfc9421", "standard-webhooks")), other, stored.id)
        stored.webhook_secrets = sealed
        session.add(stored)
        session.commit()
    answer = httpx.post(f"{live.base}{PATH}/{created['id']}/secrets/rotate", headers=ADMIN)
    assert (answer.status_code, answer.json()["reason"]) == (409, "secrets_unavailable")
    assert "USP_SECRETS_KEY" in answer.json()["detail"]
    with Session(live.engine) as session:
        stored = session.get(Subscription, created["id"])
        assert stored is not None
        assert stored.webhook_secrets == sealed, "nothing written"
