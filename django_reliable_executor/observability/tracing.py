"""OpenTelemetry tracing, when the process uses it: the submitter's trace context, the run span.

Nothing here imports OpenTelemetry. Tracing is on in a process that has imported
``opentelemetry.trace`` itself (any process with a configured SDK or an instrumentation has):
one that never did has no span to continue and no provider to record one, so it pays a
dictionary lookup per submit and per attempt, and the package need not be installed at all.

A submit (``submit``, ``submit_many``; not a schedule's runs) stores the current span's W3C trace
context (``traceparent``, ``tracestate``) on the task. The worker runs each attempt inside a span
``run <task_name>`` of kind CONSUMER, the child of that stored context (a retry is another child
of it: the same trace), or a root span when the task has none (a schedule's run).
"""

from __future__ import annotations

import sys
import time
from typing import Any

TRACER_NAME = "django_reliable_executor"
# How long the answer of tracer() holds: asking OpenTelemetry for its provider reads the
# environment each time (~80 bytecode steps), too much for every task; a provider set
# meanwhile is used within this many seconds.
RECHECK_SECONDS = 1.0
# (checked at, the provider then, its tracer or None)
_verdict: tuple[float, Any, Any] = (float("-inf"), None, None)
# The span's attributes, as DESIGN.md names them.
ATTRIBUTES = ("task_id", "attempt", "queue", "worker_id")


def _trace_api() -> Any:
    """``opentelemetry.trace`` if this process imported it (None if not, or blocked)."""
    return sys.modules.get("opentelemetry.trace")


def current_trace_context() -> dict[str, str] | None:
    """The current span's W3C trace context to store with a submitted task; None outside a
    valid span, or where OpenTelemetry is not in use."""
    trace = _trace_api()
    if trace is None:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier or None


def trace_id_of(trace_context: dict[str, str] | None) -> str | None:
    """The 32 hex digits of trace id in a stored ``traceparent`` (``00-<trace id>-<span
    id>-<flags>``), without OpenTelemetry; None when there is none."""
    if not trace_context:
        return None
    parts = str(trace_context.get("traceparent", "")).split("-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return None
    return parts[1]


def current_trace_id() -> str | None:
    """The trace id (32 hex digits) of the current valid span; None outside one."""
    trace = _trace_api()
    if trace is None:
        return None
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None


def tracer() -> Any:
    """The tracer of the run spans, when this process records spans: OpenTelemetry is in use
    and a real tracer provider is set (not the API's default no-op or proxy one). None
    otherwise: the worker then opens no span at all."""
    global _verdict
    checked_at, known, run_tracer = _verdict
    now = time.monotonic()
    if now - checked_at < RECHECK_SECONDS:
        return run_tracer
    trace = _trace_api()
    if trace is None:
        _verdict = (now, None, None)
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        run_tracer = None
    elif provider is not known or run_tracer is None:
        run_tracer = provider.get_tracer(TRACER_NAME)
    _verdict = (now, provider, run_tracer)
    return run_tracer


def parent_context(trace_context: dict[str, str] | None) -> Any:
    """The OpenTelemetry context a stored trace context stands for: the run span's parent.
    A fresh empty one when there is none, so the span is a root whatever is current."""
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace_context:
        return Context()
    return TraceContextTextMapPropagator().extract(trace_context, context=Context())
