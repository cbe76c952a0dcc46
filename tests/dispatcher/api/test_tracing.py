"""OpenTelemetry: one booking made over REST is one connected trace, from the API call through
the outbox insert, the hand-off, the worker's claim and its attempt, to the span of the receiver
library that verified it (the attempt's ``traceparent`` travels in a header the signature does
not cover). The API runs with its lifespan; the worker's part runs in-process with the engine
function a worker runs, against a receiver under uvicorn on 127.0.0.1; spans go to an
in-memory exporter.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import date, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from tests.dispatcher.conftest import ADMIN, MakeSettings, Serve
from tests.dispatcher.support import subscribe
from usp_dispatcher.api.app import create_app
from usp_receiver import JWKS, ReceivedWebhook, Verifier, WebhookReceiver
from usp_receiver._receive import Outcome
from usp_receiver._tracing import traced
from usp_receiver.fastapi import webhook_router
from usp_workers.engine import tracing
from usp_workers.engine.delivery import deliver_batch_sync
from usp_workers.storage.models import Delivery, DeliveryStatus, EventRecord

EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    tracing.configure("usp-webhooks-test", exporter=EXPORTER)
    EXPORTER.clear()
    yield EXPORTER
    tracing.disable()
    EXPORTER.clear()


def finished(spans: InMemorySpanExporter, *names: str, within: float = 10.0) -> list[ReadableSpan]:
    """The finished spans once those named are among them: the receiver's server span ends
    after its response went out, so it may finish just after the worker read that response."""
    deadline = time.monotonic() + within
    while True:
        done = list(spans.get_finished_spans())
        if set(names) <= {s.name for s in done} or time.monotonic() > deadline:
            return done
        time.sleep(0.01)


def ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    names = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        names.append(span.name)
    return names


def test_one_booking_is_one_connected_trace_from_the_rest_call_to_the_verified_receipt(
    spans: InMemorySpanExporter, make_settings: MakeSettings, serve: Serve, engine: Engine
) -> None:
    settings = make_settings()
    handled: list[str] = []
    with TestClient(create_app(settings)) as client:
        jwks = JWKS.from_dict(client.get("/.well-known/usp/jwks.json").json())

        def on_event(hook: ReceivedWebhook) -> None:
            handled.append(hook.event.event_id)

        platform = FastAPI()
        platform.include_router(webhook_router(WebhookReceiver(Verifier(jwks), on_event), path="/hooks"))
        subscribe(client, serve(platform) + "/hooks", ["booking.*"])
        today = date.today()
        window = {
            "service_id": "svc_haircut_001",
            "start_date": str(today),
            "end_date": str(today + timedelta(4)),
        }
        slot = client.get("/services/availability", params=window).json()["slots"][0]
        request = {"service_id": "svc_haircut_001", "slot_id": slot["id"], "buyer": {"first_name": "Ann"}}
        booked = client.post("/services/bookings", json=request, headers=ADMIN)
        assert booked.status_code == 201, booked.text
    with Session(engine) as session:
        [event] = session.exec(
            select(EventRecord).where(col(EventRecord.event_type) == "booking.created")
        ).all()
        ids = [d.id for d in session.exec(select(Delivery).where(col(Delivery.event_id) == event.id)).all()]
    assert event.traceparent is not None, "the event keeps the trace of the call that emitted it"

    report = deliver_batch_sync(engine, settings, ids)  # what a worker runs, later, elsewhere
    assert report.claimed == 1
    assert handled == [event.id], "the traceparent header did not break the signature"

    ended = finished(spans, "POST /hooks", "usp.receive")
    by_name = {s.name: s for s in ended}
    by_id = {s.context.span_id: s for s in ended}
    server = by_name["POST /services/bookings"]
    # The booking emits booking.created and catalog.availability.changed: two emit spans.
    [emit] = [
        s for s in ended if s.name == "usp.emit" and (s.attributes or {}).get("usp.event_id") == event.id
    ]
    handoff, claim = by_name["usp.handoff"], by_name["usp.claim"]
    attempt, receipt = by_name["usp.attempt"], by_name["usp.receive"]
    trace_ids = {s.context.trace_id for s in (server, emit, handoff, claim, attempt, receipt)}
    assert trace_ids == {server.context.trace_id}, "one trace"
    assert server.kind is SpanKind.SERVER
    assert "POST /services/bookings" in ancestors(emit, by_id)
    assert "POST /services/bookings" in ancestors(handoff, by_id)
    assert claim.parent is not None
    assert claim.parent.span_id == emit.context.span_id
    assert attempt.parent is not None
    assert attempt.parent.span_id == emit.context.span_id
    assert attempt.kind is SpanKind.CLIENT
    # The platform's server is instrumented here (OpenTelemetry's FastAPI instrumentation reaches
    # every app of the process): its request span continues the attempt's, the receipt is in it.
    platform_server = by_name["POST /hooks"]
    assert platform_server.parent is not None
    assert platform_server.parent.span_id == attempt.context.span_id, "the receiver continued the trace"
    assert "POST /hooks" in ancestors(receipt, by_id)
    assert attempt.attributes is not None
    assert attempt.attributes["http.response.status_code"] == 200
    assert attempt.attributes["usp.event_id"] == event.id
    assert receipt.attributes is not None
    assert receipt.attributes["usp.event_id"] == event.id
    with Session(engine) as session:
        assert session.get(Delivery, ids[0]).status == DeliveryStatus.SUCCEEDED  # type: ignore[union-attr]


def test_without_tracing_no_span_is_made_and_no_context_stored(
    make_settings: MakeSettings, engine: Engine
) -> None:
    assert not tracing.enabled()
    EXPORTER.clear()
    with TestClient(create_app(make_settings())) as client:
        posted = client.post("/events", json=_sample(), headers=ADMIN)
        assert posted.status_code == 202, posted.text
    with Session(engine) as session:
        record = session.get(EventRecord, posted.json()["event_id"])
        assert record is not None
        assert record.traceparent is None
    assert [s.name for s in EXPORTER.get_finished_spans() if s.name.startswith("usp.")] == []


def _sample() -> dict[str, object]:
    import json

    from usp_dispatcher.webhooks.samples import sample_event

    body: dict[str, object] = json.loads(sample_event("booking.confirmed"))
    return body


@pytest.mark.anyio
async def test_an_uninstrumented_receiver_continues_the_sender_s_traceparent(
    spans: InMemorySpanExporter,
) -> None:
    sent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

    async def receive() -> Outcome:
        return Outcome(200, {"status": "accepted"}, event_id="evt_traced")

    outcome = await traced(receive, [(b"content-type", b"application/json"), (b"traceparent", sent.encode())])
    assert outcome.status == 200
    [receipt] = [s for s in spans.get_finished_spans() if s.name == "usp.receive"]
    assert receipt.kind is SpanKind.SERVER
    assert receipt.parent is not None
    assert (receipt.parent.trace_id, receipt.parent.span_id) == (
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
    )
    assert receipt.attributes is not None
    assert receipt.attributes["usp.event_id"] == "evt_traced"


def test_an_unsampled_event_makes_no_attempt_span_and_passes_its_context_on() -> None:
    assert tracing.sampled(None)
    tracing.configure("usp-webhooks-test", exporter=EXPORTER)  # the default sampler follows the parent
    try:
        for flags, expected in (("00", False), ("02", False), ("01", True), ("03", True)):
            parent = f"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-{flags}"
            assert tracing.sampled(parent) is expected, flags
            context = tracing.context_of(parent)
            assert context is not None
        assert tracing.context_of("00-not-a-traceparent") is None
    finally:
        tracing.disable()
