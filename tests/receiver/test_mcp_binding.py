"""``NotificationBinding`` against real MCP sessions built with the official SDK.

The business side is a low-level ``mcp.server.lowlevel.Server`` whose ``emit`` tool signs USP
envelopes with the in-band JWS and pushes them to the client as ``usp_webhook`` notifications
(optionally tampered, stale, or repeated). The platform side is the SDK's ``Client`` /
``ClientSession`` with the binding plugged in. Every transport the SDK offers a test can reach is
exercised: in-process (modern, no JSON-RPC framing), in-memory JSON-RPC streams (legacy
handshake), and stdio against this very file run as a server subprocess.

Run as a script (``python test_mcp_binding.py``) this module *is* that stdio server; the signing
key arrives in ``USP_TEST_SIGNING_JWK``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.client import ClientSession, IncomingMessage
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from usp_receiver._errors import ReceiverError
from usp_receiver._jws import sign_notification_params
from usp_receiver._keys import PublicKey, SigningKey
from usp_receiver.dedupe import Claim, ClaimState, DedupeStore, MemoryDedupe
from usp_receiver.mcp import (
    EXTENSION_IDENTIFIER,
    USP_WEBHOOK_METHOD,
    NotificationBinding,
    NotificationOutcome,
    ReceivedNotification,
    USPWebhookExtension,
)
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE

JWK_ENV = "USP_TEST_SIGNING_JWK"
UspWebhook = types.Notification[dict[str, Any], str]


# -- the business: an MCP server that emits signed usp_webhook notifications ---------------------


def build_server(key: SigningKey) -> Server[Any]:
    """``emit({"notifications": [{"params": envelope, "tamper"?: bool, "iat"?: int}, ...]})``
    signs each envelope (fresh ``iat`` unless given, as a real retry would) and sends it as a
    ``usp_webhook`` notification on the request's channel, before answering."""

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"notifications": {"type": "array"}}}
        return types.ListToolsResult(tools=[types.Tool(name="emit", input_schema=schema)])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        items: list[dict[str, Any]] = (params.arguments or {}).get("notifications", [])
        for item in items:
            signed = sign_notification_params(item["params"], key, iat=item.get("iat"))
            if item.get("tamper"):
                signed["booking_id"] = "bkg_forged"
            # The SDK's typed sender is annotated with core notifications only; at run time any
            # Notification model goes out as its method and params (``exclude_none`` does not
            # reach inside a dict, so the signed None values survive).
            notification = UspWebhook(method=USP_WEBHOOK_METHOD, params=signed)
            await ctx.session.send_notification(
                notification,  # type: ignore[arg-type]
                related_request_id=ctx.request_id,
            )
        if (params.arguments or {}).get("tools_changed"):
            await ctx.session.send_notification(
                types.ToolListChangedNotification(), related_request_id=ctx.request_id
            )
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"sent {len(items)}")])

    return Server("usp-test-business", on_list_tools=list_tools, on_call_tool=call_tool)


def envelope(n: int, **extra: Any) -> dict[str, Any]:
    """A valid ``booking.confirmed`` event (a None value and ``_meta`` included, which the
    signature must cover as sent)."""
    event: dict[str, Any] = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event["data"]["notes"] = None
    return {
        **event,
        "event_id": f"evt_01JQ3Z7R8KXW4B9N2M5P6T0V{n:02d}",
        "_meta": {"usp": {"correlation_id": f"corr_{n}"}},
        **extra,
    }


# -- the platform: a handler, a key resolver and the ways to connect -----------------------------


class DictResolver:
    def __init__(self, *keys: PublicKey) -> None:
        self.keys = {key.kid: key for key in keys}

    def resolve(self, kid: str) -> PublicKey | None:
        return self.keys.get(kid)

    async def aresolve(self, kid: str) -> PublicKey | None:
        return self.resolve(kid)


class Recorder:
    """The platform's handler: records each call; raises once for ids in ``fail_once``."""

    def __init__(self, fail_once: set[str] | None = None) -> None:
        self.calls: list[ReceivedNotification] = []
        self.fail_once = set(fail_once or ())

    async def __call__(self, notification: ReceivedNotification) -> None:
        self.calls.append(notification)
        event_id = notification.event.event_id
        if event_id in self.fail_once:
            self.fail_once.discard(event_id)
            raise RuntimeError("handler crashed")

    @property
    def event_ids(self) -> list[str]:
        return [call.event.event_id for call in self.calls]


class ToolCaller(Protocol):
    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> types.CallToolResult: ...


Connect = Callable[[SigningKey, NotificationBinding], AbstractAsyncContextManager[ToolCaller]]


def _stdio_parameters(key: SigningKey) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[__file__],
        env={JWK_ENV: json.dumps(key.to_jwk())},
    )


@asynccontextmanager
async def inproc_client(key: SigningKey, binding: NotificationBinding) -> AsyncIterator[ToolCaller]:
    """``Client(server)``: in-process, modern protocol, peers call each other directly."""
    async with Client(build_server(key), extensions=[binding.extension]) as client:
        yield client


@asynccontextmanager
async def memory_jsonrpc_client(key: SigningKey, binding: NotificationBinding) -> AsyncIterator[ToolCaller]:
    """``Client(server, mode="legacy")``: JSON-RPC over in-memory streams, initialize handshake."""
    async with Client(build_server(key), mode="legacy", extensions=[binding.extension]) as client:
        yield client


@asynccontextmanager
async def stdio_session(key: SigningKey, binding: NotificationBinding) -> AsyncIterator[ToolCaller]:
    """A bare ``ClientSession`` over ``stdio_client``, bound with ``notification_bindings=``."""
    async with (
        stdio_client(_stdio_parameters(key)) as (read, write),
        ClientSession(read, write, notification_bindings=[binding.sdk_binding]) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_client_auto(key: SigningKey, binding: NotificationBinding) -> AsyncIterator[ToolCaller]:
    """``Client(StdioServerParameters)``: subprocess, protocol negotiated automatically."""
    async with Client(_stdio_parameters(key), extensions=[binding.extension]) as client:
        yield client


CONNECTIONS = [
    pytest.param(inproc_client, id="inproc"),
    pytest.param(memory_jsonrpc_client, id="memory-jsonrpc"),
    pytest.param(stdio_session, id="stdio-session"),
    pytest.param(stdio_client_auto, id="stdio-client"),
]


async def settle(binding: NotificationBinding, total: int) -> None:
    """Bound notifications are handled from a queue after the tool call returns: wait for them.

    The SDK signals nothing when its binding queue drains, so the counters are what we watch."""
    with anyio.fail_after(10):
        while binding.stats.total < total:  # noqa: ASYNC110 - no event to wait on
            await anyio.sleep(0.01)
    await anyio.sleep(0.05)  # and nothing more arrives
    assert binding.stats.total == total


# -- the scenario --------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("connect", CONNECTIONS)
async def test_verify_dedupe_and_release_over_a_real_session(connect: Connect) -> None:
    key = SigningKey.generate()
    failing = envelope(4)["event_id"]
    handler = Recorder(fail_once={failing})
    rejected: list[tuple[Any, ReceiverError]] = []
    binding = NotificationBinding(
        keys=DictResolver(key.public),
        dedupe=MemoryDedupe(),
        handler=handler,
        on_rejected=lambda params, error: rejected.append((params, error)),
    )

    async with connect(key, binding) as client:
        result = await client.call_tool(
            "emit",
            {
                "notifications": [
                    {"params": envelope(1)},
                    {"params": envelope(2)},
                    {"params": envelope(1)},  # a redelivery: duplicate
                    {"params": envelope(3), "tamper": True},  # forged after signing
                    {"params": envelope(5), "iat": int(time.time()) - 3600},  # replayed
                    {"params": envelope(4)},  # the handler crashes on it...
                    {"params": envelope(4)},  # ...so the redelivery runs it again
                ]
            },
        )
        assert not result.is_error
        await settle(binding, 7)

        # A later redelivery of a processed event, in a second call: still a duplicate.
        await client.call_tool("emit", {"notifications": [{"params": envelope(2)}]})
        await settle(binding, 8)

    # Handler ran once per distinct valid event, plus once for the crash.
    assert sorted(handler.event_ids) == sorted(
        [envelope(1)["event_id"], envelope(2)["event_id"], failing, failing]
    )
    stats = binding.stats
    assert (stats.accepted, stats.duplicates, stats.rejected, stats.failed) == (3, 2, 2, 1)
    assert sorted(error.reason for _, error in rejected) == ["bad_signature", "stale"]
    forged = next(params for params, error in rejected if error.reason == "bad_signature")
    assert forged["booking_id"] == "bkg_forged"

    # The handler saw the signed envelope, minus the signature, None values and _meta intact,
    # and the event parsed from it.
    first = next(call for call in handler.calls if call.event.event_id == envelope(1)["event_id"])
    assert first.params == envelope(1)
    assert first.params is first.verified.params
    assert first.event.event == "booking.confirmed"
    assert first.verified.kid == key.kid


@pytest.mark.anyio
async def test_rejections_are_logged_without_the_signature(caplog: pytest.LogCaptureFixture) -> None:
    key = SigningKey.generate()
    binding = NotificationBinding(keys=DictResolver(key.public), dedupe=MemoryDedupe(), handler=Recorder())
    signed = sign_notification_params(envelope(1), key)
    signature = signed["_meta"]["usp"]["signature"]
    with caplog.at_level(logging.DEBUG, logger="usp_receiver"):
        assert await binding.handle({**signed, "booking_id": "bkg_forged"}) is NotificationOutcome.REJECTED
        assert await binding.handle({**signed, "_meta": {}}) is NotificationOutcome.REJECTED
    assert "bad_signature" in caplog.text
    assert "missing_signature" in caplog.text
    assert signature not in caplog.text
    assert signature.split(".")[2] not in caplog.text
    assert binding.stats.rejected == 2


@pytest.mark.anyio
async def test_in_progress_is_not_run_and_counted() -> None:
    """Two receivers sharing a store: while one handles an event, the other's copy is skipped."""
    key = SigningKey.generate()
    store = MemoryDedupe()
    entered, release = anyio.Event(), anyio.Event()

    async def slow(notification: ReceivedNotification) -> None:
        entered.set()
        await release.wait()

    calls: list[str] = []

    async def fast(notification: ReceivedNotification) -> None:
        calls.append(notification.event.event_id)

    first = NotificationBinding(keys=DictResolver(key.public), dedupe=store, handler=slow)
    second = NotificationBinding(keys=DictResolver(key.public), dedupe=store, handler=fast)
    signed = sign_notification_params(envelope(1), key)
    outcomes: list[NotificationOutcome] = []

    async def run_first() -> None:
        outcomes.append(await first.handle(signed))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_first)
        await entered.wait()
        assert await second.handle(signed) is NotificationOutcome.IN_PROGRESS
        release.set()
    assert outcomes == [NotificationOutcome.ACCEPTED]
    assert await second.handle(signed) is NotificationOutcome.DUPLICATE
    assert calls == []
    assert (second.stats.in_progress, second.stats.duplicates) == (1, 1)


@pytest.mark.anyio
async def test_cancelled_handler_releases_its_claim() -> None:
    key = SigningKey.generate()
    store = MemoryDedupe()
    entered = anyio.Event()

    async def hangs(notification: ReceivedNotification) -> None:
        entered.set()
        await anyio.sleep_forever()

    binding = NotificationBinding(keys=DictResolver(key.public), dedupe=store, handler=hangs)
    signed = sign_notification_params(envelope(1), key)
    async with anyio.create_task_group() as tg:
        tg.start_soon(binding.handle, signed)
        await entered.wait()
        tg.cancel_scope.cancel()
    assert store.claim(envelope(1)["event_id"]).state is ClaimState.NEW


@pytest.mark.anyio
async def test_envelope_without_event_id_is_rejected() -> None:
    key = SigningKey.generate()
    errors: list[ReceiverError] = []

    async def on_rejected(params: Any, error: ReceiverError) -> None:
        errors.append(error)

    binding = NotificationBinding(
        keys=DictResolver(key.public), dedupe=MemoryDedupe(), handler=Recorder(), on_rejected=on_rejected
    )
    params = envelope(1)
    del params["event_id"]
    assert await binding.handle(sign_notification_params(params, key)) is NotificationOutcome.REJECTED
    assert await binding.handle(["not", "an", "object"]) is NotificationOutcome.REJECTED
    assert [error.reason for error in errors] == ["invalid_event", "malformed_signature"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "params",
    [
        pytest.param(envelope(1, event="booking.exploded"), id="unknown-event-type"),
        pytest.param({k: v for k, v in envelope(1).items() if k != "data"}, id="missing-data"),
        pytest.param(envelope(1, booking_id="bkg_other"), id="subject-mismatch"),
    ],
)
async def test_signed_params_that_are_not_a_usp_event_are_rejected(params: dict[str, Any]) -> None:
    """The MCP path refuses exactly what the REST path refuses: a valid signature over params
    that are not a USP event does not reach the handler, nor claim the id."""
    key = SigningKey.generate()
    errors: list[ReceiverError] = []
    handler = Recorder()
    store = MemoryDedupe()
    binding = NotificationBinding(
        keys=DictResolver(key.public),
        dedupe=store,
        handler=handler,
        on_rejected=lambda _, e: errors.append(e),
    )
    outcome = await binding.handle(sign_notification_params(params, key))
    assert outcome is NotificationOutcome.REJECTED
    assert [error.reason for error in errors] == ["invalid_event"]
    assert handler.calls == []
    assert (binding.stats.rejected, binding.stats.total) == (1, 1)
    assert len(store) == 0


class BrokenStore:
    """A dedupe store whose backend is down."""

    def claim(self, event_id: str) -> Claim:
        raise ConnectionError("store down")

    def commit(self, claim: Claim) -> None:
        raise ConnectionError("store down")

    def release(self, claim: Claim) -> None:
        raise ConnectionError("store down")

    async def aclaim(self, event_id: str) -> Claim:
        raise ConnectionError("store down")

    async def acommit(self, claim: Claim) -> None:
        raise ConnectionError("store down")

    async def arelease(self, claim: Claim) -> None:
        raise ConnectionError("store down")


@pytest.mark.anyio
async def test_a_broken_store_fails_the_event_without_running_the_handler() -> None:
    key = SigningKey.generate()
    store: DedupeStore = BrokenStore()
    handler = Recorder()
    binding = NotificationBinding(keys=DictResolver(key.public), dedupe=store, handler=handler)
    assert await binding.handle(sign_notification_params(envelope(1), key)) is NotificationOutcome.FAILED
    assert handler.calls == []
    assert binding.stats.failed == 1


def test_extension_carries_the_binding() -> None:
    binding = NotificationBinding(keys=DictResolver(), dedupe=MemoryDedupe(), handler=Recorder())
    extension = binding.extension
    assert isinstance(extension, USPWebhookExtension)
    assert extension.identifier == EXTENSION_IDENTIFIER
    assert [b.method for b in extension.notifications()] == [USP_WEBHOOK_METHOD]
    assert binding.sdk_binding.method == USP_WEBHOOK_METHOD


@pytest.mark.anyio
@pytest.mark.parametrize("bound", [False, True])
async def test_sdk_never_hands_usp_webhook_to_message_handler(
    bound: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Why the binding exists: mcp 2.3 drops a method its protocol tables do not define before
    any user callback; ``message_handler`` only ever sees core notifications, bound or not."""
    key = SigningKey.generate()
    seen: list[IncomingMessage] = []

    async def message_handler(message: IncomingMessage) -> None:
        seen.append(message)

    handler = Recorder()
    binding = NotificationBinding(keys=DictResolver(key.public), dedupe=MemoryDedupe(), handler=handler)
    # mcp.client.session logs under the name "client".
    with caplog.at_level(logging.DEBUG, logger="client"):
        async with Client(
            build_server(key),
            mode="legacy",
            message_handler=message_handler,
            extensions=[binding.extension] if bound else None,
        ) as client:
            arguments = {"notifications": [{"params": envelope(1)}], "tools_changed": True}
            await client.call_tool("emit", arguments)
            with anyio.fail_after(5):
                while not seen:  # noqa: ASYNC110 - the list is what the handler fills
                    await anyio.sleep(0.01)
            if bound:
                await settle(binding, 1)
    assert [type(message) for message in seen] == [types.ToolListChangedNotification]
    assert handler.event_ids == ([envelope(1)["event_id"]] if bound else [])
    assert ("dropped 'usp_webhook': not defined" in caplog.text) is not bound


# -- this file as the stdio server ---------------------------------------------------------------


async def _serve_stdio() -> None:  # pragma: no cover - runs in the subprocess
    server = build_server(SigningKey.from_jwk(json.loads(os.environ[JWK_ENV])))
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":  # pragma: no cover
    anyio.run(_serve_stdio)
