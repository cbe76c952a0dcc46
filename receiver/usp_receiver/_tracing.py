"""A span per received webhook when the app traces with OpenTelemetry (``usp-receiver[otel]``).

Its parent is the request's span when the app instruments its server, else the sender's W3C
``traceparent``: either way the receipt joins the business's trace of the event. Without the
package, or without a tracer provider installed, nothing is made.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

from usp_receiver._receive import Outcome

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised only without the extra installed
    trace = None  # type: ignore[assignment]

__all__ = ["traced"]

_CARRIED = {b"traceparent": "traceparent", b"tracestate": "tracestate"}


async def traced(
    receive: Callable[[], Awaitable[Outcome]], headers: Iterable[tuple[bytes, bytes]]
) -> Outcome:
    """``receive()`` inside a ``usp.receive`` span, when the app traces."""
    if trace is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return await receive()
    kind, context = trace.SpanKind.INTERNAL, None
    if not trace.get_current_span().get_span_context().is_valid:  # the server is not instrumented
        carrier = {_CARRIED[name]: value.decode("latin-1") for name, value in headers if name in _CARRIED}
        kind, context = trace.SpanKind.SERVER, TraceContextTextMapPropagator().extract(carrier)
    with trace.get_tracer("usp_receiver").start_as_current_span(
        "usp.receive", context=context, kind=kind
    ) as span:
        outcome = await receive()
        span.set_attribute("http.response.status_code", outcome.status)
        if outcome.event_id is not None:
            span.set_attribute("usp.event_id", outcome.event_id)
        if outcome.reason is not None:
            span.set_attribute("usp.reason", outcome.reason)
        if outcome.status >= 500:
            span.set_status(trace.StatusCode.ERROR)
        return outcome
