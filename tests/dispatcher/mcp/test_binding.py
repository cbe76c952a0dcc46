"""The conformance list of the USP MCP binding (``seeds/usp-mcp-binding.txt``): one named test per
MUST and per SHOULD, through the official MCP client."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import TextContent
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy.engine import Engine
from sqlmodel import col, func, select

from tests.dispatcher.conftest import ADMIN_TOKEN, MakeSettings
from tests.dispatcher.mcp.conftest import connect, stdio_parameters
from tests.dispatcher.mcp.support import (
    ALICE,
    BOB,
    HAIRCUT,
    OTHER_PROFILE,
    PROFILE,
    book,
    free_slots,
    ok,
    outcome,
    refused,
    usp,
    window,
)
from tests.dispatcher.mcp.test_stdio import INITIALIZE, RawSession, _spawn
from usp_core import db, keys
from usp_dispatcher import access
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS, SigningKey
from usp_receiver.dedupe import MemoryDedupe
from usp_receiver.mcp import NotificationBinding, ReceivedNotification
from usp_workers.engine import tracing
from usp_workers.storage.models import EventRecord

pytestmark = pytest.mark.anyio

_PATIENCE = 60  # a guard against a hang, not a timing assertion


def _event_count(engine: Engine) -> int:
    with db.session(engine) as session:
        return session.exec(select(func.count()).select_from(EventRecord)).one()


def _bound(
    credential: dict[str, Any], booking_id: str, tool: str, key: SigningKey | None, **extra: Any
) -> dict[str, Any]:
    """``tools/call`` params using a booking credential, with a ``platform_key_pop`` proof by
    ``key`` over them (none when ``key`` is None)."""
    authorization = {"mechanism": "booking_scoped_credential", "credential": credential["credential"]}
    params: dict[str, Any] = {
        "name": tool,
        "arguments": {
            "booking_id": booking_id,
            **extra,
            "_meta": {"usp": {"profile": PROFILE, "authorization": authorization}},
        },
    }
    if key is not None:
        authorization["proof"] = access.make_pop_proof(params, key)
    return params


# ------------------------------------------------------------------------------------ MUST


async def test_must_1_tools_call_envelope_with_name_and_arguments(
    mcp_engine: Engine, stdio_env: dict[str, str], tmp_path: Path
) -> None:
    """The binding's own availability example, byte for byte, over the stdio server."""
    async with await _spawn(stdio_env, tmp_path) as process:
        raw = RawSession(process)
        await raw.request(1, "initialize", INITIALIZE)
        await raw.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        dates = window(1)
        answer = await raw.request(
            2,
            "tools/call",
            {
                "name": "usp_availability_query",
                "arguments": {
                    "service_id": HAIRCUT,
                    **dates,
                    "_meta": {"usp": {"profile": PROFILE}},
                },
            },
        )
        await raw.stdin.aclose()
        with anyio.fail_after(_PATIENCE):
            await process.wait()
    structured = answer["result"]["structuredContent"]
    assert structured["service_id"] == HAIRCUT
    assert structured["messages"] == []
    assert all(slot["service_id"] == HAIRCUT for slot in structured["slots"])


async def test_must_2_results_use_the_dual_envelope(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        for arguments in (
            {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE, **usp(key=acme_key)},
            {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": BOB, **usp(key=acme_key)},  # an outcome
        ):
            result = await client.call_tool("usp_bookings_create", arguments)
            assert result.structured_content is not None
            assert result.structured_content["usp"] == {
                "version": "2026-08-20",
                "capabilities": {"dev.usp-protocol.services.bookings": [{"version": "2026-08-20"}]},
            }
            assert "messages" in result.structured_content
            ((text),) = result.content
            assert isinstance(text, TextContent)
            assert text.text


async def test_must_3_business_outcomes_are_results_with_messages(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        await book(client, slot["id"], key=acme_key)
        taken = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": BOB, **usp(key=acme_key)}
        result = await client.call_tool("usp_bookings_create", taken)  # no MCPError: a result
        assert result.structured_content is not None
        ((message),) = result.structured_content["messages"]
        assert (message["code"], message["severity"]) == ("slot_unavailable", "recoverable")
        await outcome(
            client, "usp_bookings_get", {"booking_id": "bkg_none", **usp(key=acme_key)}, "booking_not_found"
        )


async def test_must_4_json_rpc_errors_only_for_protocol_errors(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        # Malformed: an error, with the code word and the text.
        missing = {"service_id": HAIRCUT, "buyer": BOB, **usp(key=acme_key)}
        assert (
            await refused(client, "usp_bookings_create", missing, -32600) == "Missing required field: slot_id"
        )
        wrong = {"service_id": HAIRCUT, "slot_id": 7, "buyer": BOB, **usp(key=acme_key)}
        await refused(client, "usp_bookings_create", wrong, -32602)
        # Well-formed but refused by the business: never an error.
        slot = (await free_slots(client))[0]
        await book(client, slot["id"], key=acme_key)
        for name, arguments in (
            ("usp_bookings_create", {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": BOB}),
            ("usp_bookings_create", {"service_id": "svc_none", "slot_id": slot["id"], "buyer": BOB}),
            ("usp_bookings_cancel", {"booking_id": "bkg_none"}),
            ("usp_waitlist_leave", {"waitlist_entry_id": "wl_none"}),
        ):
            result = await client.call_tool(name, {**arguments, **usp(key=acme_key)})
            assert result.structured_content is not None
            assert result.structured_content["messages"], name


async def test_must_5_privileged_methods_need_the_profile_and_bind_it(
    mcp_engine: Engine, settings: Settings, acme_key: str, globex_key: str
) -> None:
    listing = "usp_feed_subscriptions_list"
    async with connect(mcp_engine, settings) as client:
        text = await refused(client, listing, usp(profile=None, key=acme_key), -32602)
        assert "profile" in text
        await ok(client, listing, usp(key=acme_key))  # first contact: key:acme is PROFILE's
        await refused(client, listing, usp(profile=OTHER_PROFILE, key=acme_key), -32003)
        await ok(client, listing, usp(key=acme_key))  # the binding holds
        await ok(client, listing, usp(key=globex_key))  # one profile, many principals: fine
        # A credential presented is bound to the profile it was issued to.
        body = await book(client, (await free_slots(client))[0]["id"], key=acme_key)
        stolen = {
            "booking_id": body["booking"]["id"],
            **usp(profile=OTHER_PROFILE, credential=body["booking_scoped_credential"]),
        }
        await refused(client, "usp_bookings_get", stolen, -32003)


async def test_must_6_unauthenticated_privileged_calls_are_rejected_when_required(
    mcp_engine: Engine, make_settings: MakeSettings
) -> None:
    required, optional = make_settings(), make_settings(require_authentication=False)
    assert "bearer" in access.policy_document(required)["mechanisms"]
    async with connect(mcp_engine, required) as client:
        slot = (await free_slots(client))[0]
        arguments = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE, **usp()}
        text = await refused(client, "usp_bookings_create", arguments, -32001)
        assert "bearer" in text
    async with connect(mcp_engine, optional) as client:
        body = await ok(client, "usp_bookings_create", arguments)
    assert body["booking"]["slot_id"] == slot["id"]


async def test_must_7_webhooks_reach_a_live_session_as_json_rpc_notifications(
    mcp_engine: Engine, settings: Settings, stdio_env: dict[str, str], tmp_path: Path, acme_key: str
) -> None:
    with db.session(mcp_engine) as session:
        jwks = JWKS.from_dict(keys.published_jwks(session, settings))
    arrived: list[ReceivedNotification] = []
    created = anyio.Event()
    raw_messages: list[Any] = []

    async def on_notification(hook: ReceivedNotification) -> None:
        arrived.append(hook)
        if hook.event.event == "booking.created":
            created.set()

    async def on_message(message: Any) -> None:
        raw_messages.append(message)

    binding = NotificationBinding(keys=jwks, dedupe=MemoryDedupe(), handler=on_notification)
    parameters = stdio_parameters(stdio_env, tmp_path)
    async with Client(
        parameters, mode="legacy", extensions=[binding.extension], message_handler=on_message
    ) as client:
        await ok(
            client,
            "usp_feed_subscriptions_create",
            {"url": "http://127.0.0.1:9/hooks", "event_types": ["booking.*"], **usp(key=acme_key)},
        )
        booking = (await book(client, (await free_slots(client))[0]["id"], key=acme_key))["booking"]
        with anyio.fail_after(_PATIENCE):
            await created.wait()
    (hook,) = [h for h in arrived if h.event.event == "booking.created"]
    assert hook.event.model_dump(mode="json")["booking_id"] == booking["id"]
    assert hook.verified.kid


async def test_must_8_a_bound_credential_without_a_valid_proof_is_absent(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    platform_key = SigningKey.generate()
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        body = await book(client, slot["id"], key=acme_key, platform_key=platform_key.public.jwk)
        credential, booking_id = body["booking_scoped_credential"], body["booking"]["id"]
        assert credential["cnf"]["jkt"] == platform_key.public.kid
        # Without a proof: treated as absent, so the call is unauthenticated ...
        bare = _bound(credential, booking_id, "usp_bookings_get", None)
        await refused(client, bare["name"], bare["arguments"], -32001)
        # ... whatever mechanism is declared for it.
        as_bearer = _bound(credential, booking_id, "usp_bookings_get", None)
        as_bearer["arguments"]["_meta"]["usp"]["authorization"]["mechanism"] = "bearer"
        await refused(client, as_bearer["name"], as_bearer["arguments"], -32001)
        # A proof by another key does not bind to cnf.jkt either.
        wrong = _bound(credential, booking_id, "usp_bookings_get", SigningKey.generate())
        await refused(client, wrong["name"], wrong["arguments"], -32001)
        # With a valid proof by the platform key it works.
        proven = _bound(credential, booking_id, "usp_bookings_get", platform_key)
        assert (await ok(client, proven["name"], proven["arguments"]))["booking"]["id"] == booking_id


# ------------------------------------------------------------------------------------ SHOULD


async def test_should_1_idempotency_key_replays_and_conflicts(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    key = str(uuid.uuid4())
    async with connect(mcp_engine, settings) as client:
        first_slot, second_slot = (s["id"] for s in (await free_slots(client))[:2])
        first = await book(client, first_slot, key=acme_key, idempotency_key=key)
        events = _event_count(mcp_engine)
        again = await book(client, first_slot, key=acme_key, idempotency_key=key)
        assert again["booking"] == first["booking"]
        assert _event_count(mcp_engine) == events  # nothing emitted again
        conflict = {
            "service_id": HAIRCUT,
            "slot_id": second_slot,
            "buyer": ALICE,
            **usp(key=acme_key, idempotency_key=key),
        }
        await outcome(client, "usp_bookings_create", conflict, "idempotency_conflict")
    with db.session(mcp_engine) as session:
        created = session.exec(
            select(EventRecord).where(col(EventRecord.event_type) == "booking.created")
        ).all()
    assert len(created) == 1


async def test_should_2_results_carry_a_human_readable_summary(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        result = await client.call_tool("usp_availability_query", {"service_id": HAIRCUT, **window()})
        assert result.structured_content is not None
        slots = result.structured_content["slots"]
        ((text),) = result.content
        assert isinstance(text, TextContent)
        assert text.text.startswith(f"Found {len(slots)} available slots for {HAIRCUT}")
        assert slots[0]["id"] in text.text
        booking = (await book(client, slots[0]["id"], key=acme_key))["booking"]
        got = await client.call_tool("usp_bookings_get", {"booking_id": booking["id"], **usp(key=acme_key)})
        ((text),) = got.content
        assert isinstance(text, TextContent)
        assert booking["id"] in text.text
        assert "pending" in text.text


async def test_should_3_stdio_credentials_travel_in_meta_authorization(
    mcp_engine: Engine, stdio_env: dict[str, str], tmp_path: Path, acme_key: str
) -> None:
    async with Client(stdio_parameters(stdio_env, tmp_path)) as client:
        slot = (await free_slots(client))[0]
        arguments = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}
        await refused(client, "usp_bookings_create", {**arguments, **usp()}, -32001)
        body = await ok(client, "usp_bookings_create", {**arguments, **usp(key=acme_key)})
    assert body["booking"]["slot_id"] == slot["id"]


async def test_should_4_a_retained_booking_credential_authorizes_scoped_calls_but_never_confirm(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        first, second = (s["id"] for s in (await free_slots(client))[:2])
        body = await book(client, first, key=acme_key)
        booking_id, credential = body["booking"]["id"], body["booking_scoped_credential"]
        scoped = usp(credential=credential)  # no API key: the credential alone
        assert (await ok(client, "usp_bookings_get", {"booking_id": booking_id, **scoped}))["booking"][
            "id"
        ] == booking_id
        moved = await ok(
            client, "usp_bookings_reschedule", {"booking_id": booking_id, "slot_id": second, **scoped}
        )
        assert moved["booking"]["slot_id"] == second
        await refused(client, "usp_bookings_confirm", {"booking_id": booking_id, **scoped}, -32003)
        other = (await book(client, first, key=acme_key, buyer=BOB))["booking"]
        await refused(client, "usp_bookings_get", {"booking_id": other["id"], **scoped}, -32003)
        cancelled = await ok(client, "usp_bookings_cancel", {"booking_id": booking_id, **scoped})
        assert cancelled["booking"]["state"] == "cancelled"
        # The business confirms with its own credential.
        confirmed = await ok(
            client, "usp_bookings_confirm", {"booking_id": other["id"], **usp(profile=None, key=ADMIN_TOKEN)}
        )
        assert confirmed["booking"]["state"] == "confirmed"


async def test_should_5_the_proof_digest_is_over_jcs_canonical_params(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    platform_key = SigningKey.generate()
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        body = await book(client, slot["id"], key=acme_key, platform_key=platform_key.public.jwk)
        credential, booking_id = body["booking_scoped_credential"], body["booking"]["id"]
        # The proof is made over the params with their members in another order: JCS sorts them,
        # so it still binds to what the server receives.
        params = _bound(credential, booking_id, "usp_bookings_cancel", None, reason="buyer é ill")
        reordered = {"arguments": dict(reversed(list(params["arguments"].items()))), "name": params["name"]}
        proof = access.make_pop_proof(reordered, platform_key)
        params["arguments"]["_meta"]["usp"]["authorization"]["proof"] = proof
        # A proof over other params (another reason) does not hold for these.
        tampered = json.loads(json.dumps(params))
        tampered["arguments"]["reason"] = "changed after signing"
        await refused(client, tampered["name"], tampered["arguments"], -32001)
        cancelled = await ok(client, params["name"], params["arguments"])
    assert cancelled["booking"]["cancellation_reason"] == "buyer é ill"


async def test_should_5_a_proof_holds_when_the_client_s_sdk_adds_trace_context(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    """With OpenTelemetry on, the official client writes ``traceparent`` into ``params._meta``
    after the platform made its proof (SEP-414): the proof still holds, and a changed argument
    is still refused."""
    exporter = InMemorySpanExporter()
    # The process's first provider stays (OpenTelemetry's rule): watch whichever one that is.
    tracing.configure("usp-webhooks-test", exporter=InMemorySpanExporter())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        platform_key = SigningKey.generate()
        async with connect(mcp_engine, settings) as client:
            slot = (await free_slots(client))[0]
            body = await book(client, slot["id"], key=acme_key, platform_key=platform_key.public.jwk)
            credential, booking_id = body["booking_scoped_credential"], body["booking"]["id"]
            proven = _bound(credential, booking_id, "usp_bookings_get", platform_key)
            got = await ok(client, proven["name"], proven["arguments"])
            tampered = _bound(credential, booking_id, "usp_bookings_get", platform_key)
            tampered["arguments"]["booking_id"] = "bkg_someone_else"
            await refused(client, tampered["name"], tampered["arguments"], -32001)
        assert got["booking"]["id"] == booking_id
        assert any(span.name.startswith("MCP send tools/call") for span in exporter.get_finished_spans())
    finally:
        tracing.disable()
