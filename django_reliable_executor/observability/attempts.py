"""One attempt as outside tools see it: its OpenTelemetry span and its Sentry scope, when in use.

``observe(task)`` is None unless this process records spans (tracing.tracer()) or has an active
Sentry client; the worker then runs the attempt exactly as without them. Neither package is
imported here: each is looked up among the modules the process already imported (Sentry's
``sentry_sdk.init`` and an OpenTelemetry SDK set-up both import theirs).
"""

from __future__ import annotations

import contextlib
import sys
from types import TracebackType
from typing import Any

from ..core.records import TaskInfo
from .tracing import parent_context, tracer


def _sentry() -> Any:
    """``sentry_sdk`` if imported and initialised with a DSN; None otherwise."""
    sentry = sys.modules.get("sentry_sdk")
    if sentry is None:
        return None
    try:
        return sentry if sentry.get_client().is_active() else None
    except AttributeError:  # sentry-sdk 1.x: no get_client(); no tags from us
        return None


def observe(task: TaskInfo) -> Attempt | None:
    """The watch over one attempt of ``task`` (RUNNING, its attempt counted); None when
    nothing watches (no span recorded, no Sentry client): the usual, free, case."""
    run_tracer = tracer()
    sentry = _sentry()
    if run_tracer is None and sentry is None:
        return None
    return Attempt(task, run_tracer, sentry)


class Attempt:
    """A context manager around one attempt: inside it, the run span ``run <task_name>`` is the
    current span (the handler's own spans are its children) and the Sentry scope carries the
    tags ``task_id``, ``task_name`` and ``queue`` (every event the handler, or the worker's
    log lines about the attempt, send has them). ``failed()`` marks the span ERROR."""

    def __init__(self, task: TaskInfo, run_tracer: Any, sentry: Any) -> None:
        self.task = task
        self._tracer = run_tracer
        self._sentry = sentry
        self._stack = contextlib.ExitStack()
        self.span: Any = None

    def __enter__(self) -> Attempt:
        task = self.task
        if self._sentry is not None:
            scope = self._stack.enter_context(self._sentry.isolation_scope())
            scope.set_tag("task_id", task.task_id)
            scope.set_tag("task_name", task.task_name)
            scope.set_tag("queue", task.queue)
        if self._tracer is not None:
            from opentelemetry.trace import SpanKind

            self.span = self._stack.enter_context(
                self._tracer.start_as_current_span(
                    f"run {task.task_name}",
                    context=parent_context(task.trace_context),
                    kind=SpanKind.CONSUMER,
                    attributes={
                        "task_id": task.task_id,
                        "attempt": task.attempts,
                        "queue": task.queue,
                        "worker_id": task.worker_id or "",
                    },
                )
            )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.__exit__(exc_type, exc, tb)

    def suspended(self, wait: Any) -> None:
        """The handler stopped to wait (a durable wait, ``wait``) or at a stop (None): not an
        error; the span says which."""
        span = self.span
        if span is not None:
            span.set_attribute("reliable_executor.wait", "stop" if wait is None else wait.kind)

    def failed(self, exc: BaseException | None = None, error: str | None = None) -> None:
        """The attempt failed: with the exception the handler raised (recorded on the span
        with its traceback), or with the error text recorded for it (a child process's
        traceback, a timeout, a missing handler)."""
        span = self.span
        if span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        if exc is not None:
            span.record_exception(exc)
            description = f"{type(exc).__name__}: {exc}"
        else:
            text = (error or "failed").strip()
            description = text.splitlines()[-1] if text else "failed"
            kind, _, message = description.partition(": ")
            span.add_event(
                "exception",
                {
                    "exception.type": kind if message else "TaskFailure",
                    "exception.message": message or description,
                    "exception.stacktrace": text,
                },
            )
        span.set_status(Status(StatusCode.ERROR, description))

    def child_trace_context(self) -> dict[str, str] | None:
        """The run span's W3C trace context, for a process pool child: the handler's spans
        there become the run span's children."""
        if self.span is None:
            return None
        from opentelemetry.trace import set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=set_span_in_context(self.span))
        return carrier or None


@contextlib.contextmanager
def in_child(task: TaskInfo, trace_context: dict[str, str] | None) -> Any:
    """A process pool child's side of an attempt: the worker's run span (``trace_context``)
    made current, so the handler's spans are its children, and the Sentry tags."""
    with contextlib.ExitStack() as stack:
        sentry = _sentry()
        if sentry is not None:
            scope = stack.enter_context(sentry.isolation_scope())
            scope.set_tag("task_id", task.task_id)
            scope.set_tag("task_name", task.task_name)
            scope.set_tag("queue", task.queue)
        if trace_context and tracer() is not None:
            from opentelemetry import context as otel_context

            token = otel_context.attach(parent_context(trace_context))
            stack.callback(otel_context.detach, token)
        yield
