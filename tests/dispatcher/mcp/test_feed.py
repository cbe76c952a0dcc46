"""``usp_feed_subscriptions_*`` beyond their success paths: idempotency keys on creation (the
subscription is written in :func:`usp_dispatcher.scheduling.perform`'s transaction) and whose
subscriptions a listing shows (one filter, :func:`usp_dispatcher.webhooks.feed.list_subscriptions`)."""

from __future__ import annotations

import json
import threading
import time

import pytest
import sqlalchemy as sa
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlmodel import select

from tests.dispatcher.conftest import ADMIN_TOKEN, MakeSettings
from tests.dispatcher.mcp.conftest import connect
from tests.dispatcher.mcp.support import OTHER_PROFILE, PROFILE, ok, outcome, refused, usp
from usp_core import db
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.scheduling.tables import IdempotencyRecord
from usp_dispatcher.webhooks import feed
from usp_workers.engine.webhook_secrets import unseal
from usp_workers.storage.models import Subscription, Transport

pytestmark = pytest.mark.anyio

HOOK = "http://127.0.0.1:9/hooks/usp"


def _subscriptions(engine: Engine) -> list[Subscription]:
    with db.session(engine) as session:
        return list(session.exec(select(Subscription)).all())


async def test_the_same_key_and_arguments_answer_the_first_subscription(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    meta = usp(key=acme_key, idempotency_key="sub-once")
    arguments = {"url": HOOK, "event_types": ["booking.*"], **meta}
    async with connect(mcp_engine, settings) as client:
        first = await ok(client, "usp_feed_subscriptions_create", arguments)
        again = await ok(client, "usp_feed_subscriptions_create", arguments)
    assert again["subscription"] == first["subscription"]
    ((stored),) = _subscriptions(mcp_engine)
    assert stored.id == first["subscription"]["id"]
    with db.session(mcp_engine) as session:
        ((record),) = session.exec(select(IdempotencyRecord)).all()
    assert (record.principal, record.key) == ("key:acme", "sub-once")


async def test_a_platform_asks_for_ordered_delivery(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    arguments = {"url": HOOK, "ordering": "subject", "on_dead": "skip", **usp(key=acme_key)}
    async with connect(mcp_engine, settings) as client:
        created = await ok(client, "usp_feed_subscriptions_create", arguments)
        assert (created["subscription"]["ordering"], created["subscription"]["on_dead"]) == (
            "subject",
            "skip",
        )
        await refused(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, "ordering": "total", **usp(key=acme_key)},
            -32602,
        )
    ((stored),) = _subscriptions(mcp_engine)
    assert (stored.ordering, stored.on_dead) == ("subject", "skip")


async def test_the_same_key_with_other_arguments_is_an_idempotency_conflict(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    meta = usp(key=acme_key, idempotency_key="sub-reused")
    async with connect(mcp_engine, settings) as client:
        await ok(client, "usp_feed_subscriptions_create", {"url": HOOK, **meta})
        message = await outcome(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, "event_types": ["waitlist.*"], **meta},
            "idempotency_conflict",
        )
        assert "idempotency" in message["content"].lower()
    assert len(_subscriptions(mcp_engine)) == 1


async def test_a_refused_url_stores_no_key_and_no_subscription(
    mcp_engine: Engine, make_settings: MakeSettings, acme_key: str
) -> None:
    """The SSRF check runs before the transaction: a refusal leaves nothing behind, so the same
    key works once the URL is fixed."""
    strict = make_settings(allow_private_targets=False)
    meta = usp(key=acme_key, idempotency_key="sub-fixed")
    async with connect(mcp_engine, strict) as client:
        text = await refused(client, "usp_feed_subscriptions_create", {"url": HOOK, **meta}, -32602)
        assert "refused" in text
    assert _subscriptions(mcp_engine) == []
    with db.session(mcp_engine) as session:
        assert session.exec(select(IdempotencyRecord)).all() == []


async def test_a_platform_lists_its_own_and_the_business_lists_all(
    mcp_engine: Engine, settings: Settings, acme_key: str, globex_key: str
) -> None:
    acme, globex = usp(key=acme_key), usp(profile=OTHER_PROFILE, key=globex_key)
    business = usp(profile=PROFILE, key=ADMIN_TOKEN)
    async with connect(mcp_engine, settings) as client:
        mine = [
            (await ok(client, "usp_feed_subscriptions_create", {"url": f"{HOOK}/{n}", **acme}))[
                "subscription"
            ]["id"]
            for n in range(3)
        ]
        theirs = (await ok(client, "usp_feed_subscriptions_create", {"url": HOOK, **globex}))["subscription"][
            "id"
        ]
        first = await ok(client, "usp_feed_subscriptions_list", {"limit": 2, **acme})
        assert [s["id"] for s in first["subscriptions"]] == mine[:2]
        rest = await ok(
            client, "usp_feed_subscriptions_list", {"cursor": first["next_cursor"], "limit": 2, **acme}
        )
        assert ([s["id"] for s in rest["subscriptions"]], rest["next_cursor"]) == (mine[2:], None)
        everyone = await ok(client, "usp_feed_subscriptions_list", business)
        assert [s["id"] for s in everyone["subscriptions"]] == [*mine, theirs]


def test_list_subscriptions_filters_by_profile(mcp_engine: Engine) -> None:
    """``platform_profile=None`` is the business's own (no profile), not everyone's."""
    with db.session(mcp_engine) as session:
        made: dict[str | None, str] = {}
        for profile in (None, PROFILE, OTHER_PROFILE):
            checked = feed.CheckedSubscription(HOOK, Transport.REST, ("*",), profile)
            made[profile] = feed.add_subscription(session, checked).id
        session.commit()

        def ids(platform_profile: str | feed.AnyProfile | None = feed.ANY_PROFILE) -> list[str]:
            page = feed.list_subscriptions(session, platform_profile=platform_profile)
            return [s.id for s in page.items]

        assert ids() == [made[None], made[PROFILE], made[OTHER_PROFILE]]
        assert ids(platform_profile=feed.ANY_PROFILE) == ids()
        assert ids(platform_profile=None) == [made[None]]
        assert ids(platform_profile=PROFILE) == [made[PROFILE]]
        assert ids(platform_profile="https://nobody.example/p.json") == []


def test_counting_a_profiles_subscriptions_holds_off_a_concurrent_count_until_commit(
    mcp_engine: Engine,
) -> None:
    """The limit is a count, then an insert: a second create for the same profile counts only
    after the first one committed (so both cannot take the last place). On PostgreSQL another
    profile's count does not wait; SQLite serialises all writers."""
    postgresql = mcp_engine.dialect.name == "postgresql"
    counted: list[int] = []

    def count(profile: str) -> None:
        with db.session(mcp_engine) as other:
            counted.append(feed.count_active_subscriptions(other, profile))

    with db.session(mcp_engine) as first:
        assert feed.count_active_subscriptions(first, PROFILE) == 0
        if postgresql:
            count(OTHER_PROFILE)  # not held back
            assert counted == [0]
        before = list(counted)
        second = threading.Thread(target=count, args=(PROFILE,))
        second.start()
        if postgresql:
            _wait_for_advisory_lock_wait(mcp_engine)
        else:
            second.join(0.5)
        assert counted == before, "the second count waits for the first transaction"
        feed.add_subscription(first, feed.CheckedSubscription(HOOK, Transport.REST, ("*",), PROFILE))
        first.commit()
    second.join(10)
    assert counted == [*before, 1], "it counted after the commit: the new subscription included"


def _wait_for_advisory_lock_wait(engine: Engine) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with engine.connect() as connection:
            statement = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
            if connection.execute(sa.text(statement)).scalar_one():
                return
        time.sleep(0.02)
    pytest.fail("no session waited for the advisory lock")


async def test_a_platform_keeps_a_bounded_number_of_active_subscriptions(
    mcp_engine: Engine, settings: Settings, acme_key: str, globex_key: str
) -> None:
    """Every event fans out to each of a profile's subscriptions: without a bound, one platform
    could turn each catalog event into thousands of POSTs at a URL of its choosing."""
    cap = feed.MAX_PROFILE_SUBSCRIPTIONS
    async with connect(mcp_engine, settings) as client:
        made = [
            await ok(client, "usp_feed_subscriptions_create", {"url": f"{HOOK}/{n}", **usp(key=acme_key)})
            for n in range(cap)
        ]
        message = await outcome(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, **usp(key=acme_key)},
            "subscription_limit_reached",
        )
        assert str(cap) in message["content"]
        # another platform is not held back by acme's subscriptions
        await ok(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, **usp(profile=OTHER_PROFILE, key=globex_key)},
        )
        # a deleted subscription frees its place
        first = made[0]["subscription"]["id"]
        await ok(client, "usp_feed_subscriptions_delete", {"subscription_id": first, **usp(key=acme_key)})
        await ok(client, "usp_feed_subscriptions_create", {"url": HOOK, **usp(key=acme_key)})
    assert len(_subscriptions(mcp_engine)) == cap + 2


async def test_a_platform_asks_for_standard_webhooks_and_sees_the_secret_once(
    mcp_engine: Engine, make_settings: MakeSettings, acme_key: str
) -> None:
    """The tool takes ``signatures`` as REST does; the secret is in the first answer only: an
    idempotent replay answers ``webhook_secret: null`` (the record never held it), and the sealed
    secret opens to the one shown."""
    sealed_settings = make_settings(secrets_key=SecretStr("mcp-secrets-key"))
    meta = usp(key=acme_key, idempotency_key="sub-standard")
    arguments = {"url": HOOK, "signatures": ["rfc9421", "standard-webhooks"], **meta}
    async with connect(mcp_engine, sealed_settings) as client:
        first = await ok(client, "usp_feed_subscriptions_create", arguments)
        again = await ok(client, "usp_feed_subscriptions_create", arguments)
        await refused(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, "signatures": ["standard-webhooks"], **usp(key=acme_key)},
            -32602,
        )
    created = first["subscription"]
    assert created["signatures"] == ["rfc9421", "standard-webhooks"]
    assert created["webhook_secret"].startswith("whsec_")
    assert again["subscription"]["webhook_secret"] is None
    with db.session(mcp_engine) as session:
        ((record),) = session.exec(select(IdempotencyRecord)).all()
        ((stored),) = session.exec(select(Subscription)).all()
    assert created["webhook_secret"] not in record.response
    assert stored.webhook_secrets is not None
    assert created["webhook_secret"] not in stored.webhook_secrets, "sealed, not in the clear"
    opened = unseal(stored.webhook_secrets, sealed_settings.secrets_key, stored.id)
    assert opened.secret == created["webhook_secret"]


async def test_a_platform_subscribes_with_a_payload_filter_and_headers(
    mcp_engine: Engine, make_settings: MakeSettings, acme_key: str
) -> None:
    """The tool takes ``filter`` as REST does; a bad one is invalid params naming the part."""
    haircuts = {"path": "data.service_id", "eq": "svc_haircut_001"}
    async with connect(mcp_engine, make_settings()) as client:
        arguments = {"url": HOOK, "filter": haircuts, "headers": [{"name": "X-Tenant", "value": "acme"}]}
        created = await ok(client, "usp_feed_subscriptions_create", {**arguments, **usp(key=acme_key)})
        await refused(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, "headers": [{"name": "Signature", "value": "x"}], **usp(key=acme_key)},
            -32602,
        )
        await refused(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, "filter": {"path": "data.service_id", "like": "svc%"}, **usp(key=acme_key)},
            -32602,
        )
    assert created["subscription"]["filter"] == haircuts
    assert created["subscription"]["headers"] == [{"name": "X-Tenant", "value": "acme", "secret": False}]
    ((stored),) = _subscriptions(mcp_engine)
    assert stored.payload_filter is not None
    assert json.loads(stored.payload_filter) == haircuts


async def test_a_platform_subscribes_with_its_own_schedule_and_a_gateway_s_oauth_credentials(
    mcp_engine: Engine, make_settings: MakeSettings, acme_key: str
) -> None:
    """The tool takes ``retry_schedule`` and ``auth`` as REST does; the client secret is sealed
    and never in an answer (nor in the idempotency record)."""
    sealed_settings = make_settings(secrets_key=SecretStr("mcp-secrets-key"))
    auth = {
        "type": "oauth2_client_credentials",
        "token_url": "http://127.0.0.1:9/token",
        "client_id": "acme",
        "client_secret": "mcp-oauth-secret-77",
    }
    arguments = {"url": HOOK, "retry_schedule": {"delays": [10, 60]}, "auth": auth, **usp(key=acme_key)}
    async with connect(mcp_engine, sealed_settings) as client:
        created = (await ok(client, "usp_feed_subscriptions_create", arguments))["subscription"]
        await refused(
            client,
            "usp_feed_subscriptions_create",
            {"url": HOOK, "retry_schedule": {"delays": []}, **usp(key=acme_key)},
            -32602,
        )
    assert created["retry_schedule"] == {"delays": [10.0, 60.0], "max_age_seconds": None}
    assert created["auth"]["client_secret"] == "********"
    with db.session(mcp_engine) as session:
        records = session.exec(select(IdempotencyRecord)).all()
        ((stored),) = session.exec(select(Subscription)).all()
    assert all("mcp-oauth-secret-77" not in record.response for record in records)
    assert stored.endpoint_auth is not None
    assert "mcp-oauth-secret-77" not in stored.endpoint_auth
