"""Content events go through the same pipeline as bookings: written in the change's transaction,
signed, delivered, verified by the receiver library. Posts and publications reach every
subscription to ``content.*``; an agent's subscription and entitlement reach the business only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.dispatcher.conftest import ADMIN, MakeSettings
from tests.dispatcher.ucap.conftest import Agent
from tests.dispatcher.ucap.support import pay, start_usdc
from tests.workers.conftest import hub_server
from tests.workers.endpoints import UspReceiver
from tests.workers.support import Endpoints
from usp_core import db, keys
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.ucap.seed import DEMO_PUBLICATION
from usp_receiver import JWKS
from usp_workers.engine.background import close_background_runtime
from usp_workers.engine.delivery import deliver_batch_sync
from usp_workers.storage.models import Delivery, EventRecord

PLATFORM = "https://agents.example/profile.json"


@pytest.fixture
def webhooks() -> Iterator[Endpoints]:
    with hub_server() as hub:
        registry = Endpoints(hub)
        yield registry
        registry.close()
    close_background_runtime()


def subscribe(api: TestClient, url: str, profile: str | None) -> None:
    body = {"url": url, "event_types": ["content.*"]} | ({"platform_profile": profile} if profile else {})
    answer = api.post("/services/feed/subscriptions", json=body, headers=ADMIN)
    assert answer.status_code == 201, answer.text


def deliver_all(engine: Engine, settings: Settings) -> None:
    with db.session(engine) as session:
        pending = list(session.exec(select(Delivery.id).where(col(Delivery.status) == "pending")).all())
    report = deliver_batch_sync(engine, settings, pending)
    assert report.succeeded == len(pending)


def test_content_events_are_signed_and_delivered(
    api: TestClient, alice: Agent, engine: Engine, make_settings: MakeSettings, webhooks: Endpoints
) -> None:
    settings = make_settings()
    with db.session(engine) as session:
        jwks = JWKS.from_dict(keys.published_jwks(session, settings))
    business, platform = UspReceiver(jwks), UspReceiver(jwks)
    subscribe(api, webhooks.add("business", business), None)
    subscribe(api, webhooks.add("platform", platform), PLATFORM)

    post = {
        "title": "Agents and the open web",
        "body_html": "<p>What a signed agent may read.</p>",
        "tier_ids": ["tier_ai_weekly_pro"],
        "categories": ["agents"],
    }
    made = api.post(f"/admin/ucap/publications/{DEMO_PUBLICATION}/posts", json=post, headers=ADMIN)
    assert made.status_code == 201, made.text
    assert pay(api, alice, start_usdc(api, alice)).status_code == 200
    deliver_all(engine, settings)

    with db.session(engine) as session:
        kinds = dict(session.exec(select(EventRecord.id, EventRecord.event_type)).all())
    heard_by_business = sorted(kinds[i] for i in business.handled)
    heard_by_platform = sorted(kinds[i] for i in platform.handled)
    assert heard_by_business == [
        "content.entitlement.granted",
        "content.post.published",
        "content.subscription.activated",
        "content.subscription.created",
    ]
    assert heard_by_platform == ["content.post.published"]


def test_trigger_posts_a_content_sample(api: TestClient, engine: Engine) -> None:
    from usp_dispatcher.webhooks.samples import sample_event
    from usp_schemas import EVENT_TYPES, parse_event

    for kind in [k for k in EVENT_TYPES if k.startswith("content.")]:
        event = parse_event(sample_event(kind))
        assert event.event == kind
        accepted = api.post(
            "/events", content=sample_event(kind), headers=ADMIN | {"Content-Type": "application/json"}
        )
        assert accepted.status_code in (200, 201, 202), accepted.text
