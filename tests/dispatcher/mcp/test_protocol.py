"""Protocol errors: each JSON-RPC code of SPEC-NOTES, in the binding's shape (``message`` the code
word, ``data.content`` the text), and never an exception's text."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher.mcp.conftest import connect
from tests.dispatcher.mcp.support import ALICE, HAIRCUT, OTHER_PROFILE, refused, usp, window
from usp_core import db
from usp_dispatcher.cli.config import Settings
from usp_receiver import SigningKey

pytestmark = pytest.mark.anyio


async def test_an_unknown_tool_is_method_not_found(mcp_engine: Engine, settings: Settings) -> None:
    async with connect(mcp_engine, settings) as client:
        text = await refused(client, "usp_bookings_teleport", {}, -32601)
    assert "usp_bookings_teleport" in text


async def test_bad_arguments_are_invalid_params_without_echoing_the_input(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    secret = "sk_live_do_not_echo_me"
    async with connect(mcp_engine, settings) as client:
        # A missing argument: the binding's own example, verbatim.
        missing = await refused(
            client, "usp_availability_query", {"service_id": HAIRCUT, "end_date": "x"}, -32600
        )
        assert missing == "Missing required field: start_date"
        assert await refused(client, "usp_availability_query", {"start_date": "2026-01-01"}, -32600) == (
            "Missing required fields: service_id, end_date"
        )
        nested = {"service_id": HAIRCUT, "slot_id": "s", "buyer": {"last_name": "Q"}, **usp(key=acme_key)}
        assert await refused(client, "usp_bookings_create", nested, -32600) == (
            "Missing required field: buyer.first_name"
        )
        wrong = await refused(
            client,
            "usp_availability_query",
            {"service_id": HAIRCUT, "start_date": secret, "end_date": 3},
            -32602,
        )
        assert secret not in wrong
        extra = await refused(
            client,
            "usp_bookings_create",
            {"service_id": HAIRCUT, "slot_id": "s", "buyer": ALICE, "surprise": secret, **usp(key=acme_key)},
            -32602,
        )
        assert "surprise" in extra
        assert secret not in extra
        meta = await refused(client, "usp_catalog_list", {"_meta": {"usp": "not an object"}}, -32602)
        assert "_meta" in meta
        key = await refused(client, "usp_catalog_list", {"_meta": {"usp": {"idempotency_key": ""}}}, -32602)
        assert "idempotency_key" in key
        # JSON allows NUL in strings, PostgreSQL's text does not: the caller's mistake, not a crash.
        for name, arguments in (
            ("usp_bookings_get", {"booking_id": "bkg_\x00"}),
            ("usp_availability_query", {"service_id": "svc\x00", **window()}),
            (
                "usp_bookings_create",
                {"service_id": HAIRCUT, "slot_id": "s", "buyer": {"first_name": "A\x00"}},
            ),
        ):
            assert "NUL" in await refused(client, name, {**arguments, **usp(key=acme_key)}, -32602)


async def test_no_credential_on_a_privileged_tool_is_unauthenticated(
    mcp_engine: Engine, settings: Settings
) -> None:
    arguments = {"service_id": HAIRCUT, "slot_id": "s", "buyer": ALICE}
    async with connect(mcp_engine, settings) as client:
        await refused(client, "usp_bookings_create", {**arguments, **usp()}, -32001)
        await refused(client, "usp_bookings_create", {**arguments, **usp(key="uspk_not-a-real-key")}, -32001)


async def test_a_profile_other_than_the_bound_one_is_forbidden(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        first = await client.call_tool("usp_feed_subscriptions_list", usp(key=acme_key))
        assert not first.is_error
        text = await refused(
            client, "usp_feed_subscriptions_list", usp(profile=OTHER_PROFILE, key=acme_key), -32003
        )
    assert acme_key not in text


async def test_an_unexpected_failure_is_internal_error_with_a_generic_text(
    settings: Settings, tmp_path: Path
) -> None:
    # A database the server cannot use (never migrated): a real failure inside a handler.
    broken = db.make_engine(f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    try:
        async with connect(broken, settings) as client:
            text = await refused(
                client, "usp_availability_query", {"service_id": HAIRCUT, **window()}, -32603
            )
    finally:
        broken.dispose()
    lowered = text.lower()
    for leak in ("sqlite", "table", "select", "error:", "sched_", "operational"):
        assert leak not in lowered, text


async def test_a_platform_key_must_be_a_valid_public_jwk(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    private = SigningKey.generate().to_jwk()
    assert "d" in private
    arguments = {"service_id": HAIRCUT, "slot_id": "slot_x", "buyer": ALICE}
    async with connect(mcp_engine, settings) as client:
        for key, why in (
            (private, "public"),
            ({"kty": "OKP"}, "valid"),
            ({"kty": "oct", "k": "c2VjcmV0"}, "public"),
        ):
            text = await refused(
                client, "usp_bookings_create", {**arguments, **usp(key=acme_key, platform_key=key)}, -32602
            )
            assert why in text
            assert private["d"] not in text


async def test_an_unexpected_argument_name_is_not_echoed_when_unprintable_or_long(
    mcp_engine: Engine, settings: Settings
) -> None:
    """An argument's name is input too: a line separator in it broke line-based readers of the
    answer (U+0085), and a credential pasted as a name would be echoed whole."""
    secret = "sk_live_" + "x" * 200
    async with connect(mcp_engine, settings) as client:
        for name in ("\x85", "a\nb", secret):
            text = await refused(
                client, "usp_availability_query", {name: None, "service_id": HAIRCUT, **window()}, -32602
            )
            assert name not in text
            assert text.isprintable()
