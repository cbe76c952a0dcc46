"""OpenTelemetry traces of an event's way out: emit, hand-off, claim, each attempt.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.engine.tracing``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

__all__ = [
    "configure",
    "context_of",
    "disable",
    "enabled",
    "inject",
    "sampled",
    "span",
    "start_span",
    "traceparent",
]

_PROPAGATOR: Final = TraceContextTextMapPropagator()
_tracer: trace.Tracer | None = None
#: The sampler follows the parent's decision (OpenTelemetry's default, and parentbased_*): a
#: child of an unsampled span is not made at all, not even as a non-recording one.
_follow_parent = False


def configure(service_name: str, *, exporter: SpanExporter | None = None) -> bool:
    """Trace this process when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (OTLP over HTTP, batched),
    or into ``exporter`` (tests: every span at once). Returns whether tracing is on. The first
    provider of a process stays (OpenTelemetry refuses to replace it)."""
    global _tracer
    if exporter is None:
        if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
            return False
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processor: BatchSpanProcessor | SimpleSpanProcessor = BatchSpanProcessor(OTLPSpanExporter())
    else:
        processor = SimpleSpanProcessor(exporter)
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    global _follow_parent
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("usp_workers")
    _follow_parent = isinstance(provider.sampler, ParentBased)
    return True


def disable() -> None:
    """Stop making spans (the provider stays; tests turn tracing on and off)."""
    global _tracer
    _tracer = None


def enabled() -> bool:
    return _tracer is not None


def traceparent() -> str | None:
    """The current span's W3C ``traceparent`` (``None`` when not tracing)."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def context_of(parent: str | None) -> Context | None:
    """The context a stored ``traceparent`` names (one we wrote: ``00-<32 hex>-<16 hex>-<2 hex>``;
    parsed by slicing, a fifth of the propagator's cost, which tries every version and form)."""
    if parent is None or len(parent) != 55:
        return None
    try:
        span_context = SpanContext(
            trace_id=int(parent[3:35], 16),
            span_id=int(parent[36:52], 16),
            is_remote=True,
            trace_flags=TraceFlags(int(parent[53:55], 16)),
        )
    except ValueError:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context)) if span_context.is_valid else None


def sampled(parent: str | None) -> bool:
    """Whether a span under ``parent`` could be recorded: not when the sampler follows the
    parent and the parent was not sampled (bit 0 of its flags, the last two hex digits, clear;
    bit 1 says the trace id is random)."""
    if not _follow_parent or parent is None or len(parent) != 55:
        return True
    return parent[54] in "13579bdfBDF"


def inject(headers: dict[str, str]) -> None:
    """Add the current span's ``traceparent`` (and ``tracestate``) to outgoing ``headers``."""
    if _tracer is not None:
        _PROPAGATOR.inject(headers)


@contextmanager
def span(
    name: str,
    *,
    parent: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span | None]:
    """A current span (a child of ``parent``'s context when given, else of the current one), or
    nothing when not tracing."""
    if _tracer is None or not sampled(parent if parent is not None else traceparent()):
        yield None
        return
    with _tracer.start_as_current_span(
        name, context=context_of(parent), kind=kind, attributes=attributes
    ) as made:
        yield made


def start_span(
    name: str, *, parents: Sequence[str], start_time: int, attributes: Mapping[str, Any] | None = None
) -> Span | None:
    """A span that began at ``start_time`` (ns) for work done for many events at once (a claim):
    the child of the first one's trace, linked to the others'. The caller ends it."""
    if _tracer is None:
        return None
    if parents:
        parents = [p for p in parents if sampled(p)]
        if not parents:  # every event's trace went unsampled: so does its claim
            return None
    contexts = [trace.get_current_span(context_of(p)).get_span_context() for p in parents]
    links = [Link(c) for c in contexts[1:33] if c.is_valid]
    first = context_of(parents[0]) if parents else None
    return _tracer.start_span(name, context=first, links=links, start_time=start_time, attributes=attributes)
