"""Run one claimed task: start it, resolve the handler, convert the parameter, record it."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import operator
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..connections import close_connections, with_reconnect
from ..core.progress import Progress
from ..core.records import Claim
from ..core.serialization import ConversionError, from_json_value
from ..core.states import TaskStatus
from ..core.waits import Wait
from ..exceptions import StorageUnavailableError, storage_unavailable
from ..observability.attempts import Attempt, observe
from ..registry import TaskHandler, get_handler, resolve_handler
from ..service.reliable_executor import ReliableExecutor
from .attempt_limits import AttemptLimit, AttemptTimer, ask_to_stop, attempt_timeout_of
from .completion_writer import CompletionWriter, hand_over
from .context import TaskContext
from .failures import FailureRecorder
from .group_commit import GroupCommitter
from .progress_writer import ProgressWriter
from .steps import Checkpoints
from .suspended import Suspended

_TASK = operator.attrgetter("task")

logger = logging.getLogger("django_reliable_executor")


def _refused(exc: BaseException) -> bool:
    """The storage refused a write (rather than being out of reach)."""
    return isinstance(exc, Exception) and not storage_unavailable(exc)


@dataclasses.dataclass(frozen=True)
class Begun:
    """A started claim whose handler is to be called with ``parameter``."""

    claim: Claim  # as started: RUNNING, this attempt counted
    handler: TaskHandler[Any]
    parameter: Any


def is_async_handler(handler: TaskHandler[Any] | None) -> bool:
    """An ``async def`` handler: it runs on the worker's event loop, not in a pool thread."""
    return handler is not None and handler.is_async


class TaskRunner:
    """Executes claims for one worker; every outcome write carries the claim's fencing token."""

    def __init__(self, executor: ReliableExecutor, lease_seconds: float) -> None:
        self.executor = executor
        self.lease_seconds = lease_seconds
        self.contexts: dict[str, TaskContext] = {}
        # The pool thread (its ident) running each task's handler, with the claim as started:
        # where the stack responder (stacks.py) finds a handler's frames.
        self.running_threads: dict[str, tuple[int, Claim]] = {}
        # Set by the worker once it is asked to stop: a handler's next durable step hands its
        # task back instead of running (steps.Checkpoints).
        self.stopping = threading.Event()
        # The attempt_timeout of handlers run in threads (the event loop and the process pool
        # keep their own time); its thread starts with the first limit.
        self.limits = AttemptTimer()
        self.failures = FailureRecorder(executor, lease_seconds)
        # Pool threads that start at the same moment share one storage write.
        # A start is fenced by the claim's token, so repeating it on a new connection after
        # the server killed the old one is safe (a start that did commit is not made twice).
        # A batch the storage refuses (rather than cannot reach) is written again item by item,
        # so one task it cannot take does not fail the others.
        self._starts: GroupCommitter[Claim, Claim | None] = GroupCommitter(
            self._start_many, isolate=_refused
        )
        # Started by the worker (start_writer): it writes every completion in the background,
        # in batches, and fails alone a result the storage refuses (see completions.py).
        self.writer: CompletionWriter | None = None
        # Handlers' progress reports, coalesced per task and written by a thread of its own.
        self.progress: ProgressWriter[tuple[Claim, Progress]] = ProgressWriter(
            lambda reports: with_reconnect(lambda: self.storage.record_progress(reports)),
            on_exit=close_connections,
        )

    def start_writer(
        self, written: Callable[[list[Claim]], None] | None = None
    ) -> CompletionWriter:
        self.writer = CompletionWriter(
            lambda outcomes: self.storage.complete_many(outcomes),
            self.executor.announcer.transitions,
            self.failures.discarded,
            written,
            refuse=self.failures.refuse_result,
        )
        return self.writer

    def _start_many(self, claims: list[Claim]) -> list[Claim | None]:
        """One start write for ``claims``; the metrics of those it started counted at once."""
        started = with_reconnect(lambda: self.storage.start_many(claims, self.lease_seconds))
        # Claims are truthy: filter(None) drops the starts refused, in C like the map.
        self.executor.announcer.starts_recorded(list(map(_TASK, filter(None, started))))
        return started

    def claimed(self, claims: list[Claim]) -> int:
        """Claims just taken: the metrics of those the claim itself started counted at once
        (``begin`` announces each as it runs). Returns how many it started."""
        started = [claim.task for claim in claims if claim.is_started]
        if started:
            self.executor.announcer.starts_recorded(started)
        return len(started)

    @property
    def storage(self) -> Any:
        return self.executor.storage

    @staticmethod
    def is_async(claim: Claim) -> bool:
        """The claim's registered handler is an ``async def`` one (for the event loop). Not
        through the resolvers: they import modules and log, which the thread running the
        claim does anyway (and the handlers they find, Django tasks', are synchronous)."""
        return is_async_handler(get_handler(claim.task.task_name))

    def run(self, claim: Claim) -> TaskStatus | None:
        """Run one claim to its outcome; returns the recorded status, or None when the claim was
        no longer ours (cancelled, expired, or reclaimed after a lost lease). COMPLETED means
        handed to the writer, which records it shortly (or discards it, if no longer ours)."""
        writer = self.writer or self._writer()
        begun = self.begin(claim)
        if not isinstance(begun, Begun):
            return begun
        attempt = observe(begun.claim.task)
        if attempt is None:  # no span recorded, no Sentry: nothing to open
            return self._call(begun, writer)
        with attempt:
            return self._call(begun, writer, attempt)

    def begin(self, claim: Claim) -> Begun | TaskStatus | None:
        """Start one claim (the start write, shared with claims starting at the same moment):
        what to call, or the status recorded instead (None: the claim was no longer ours).
        The process pool calls it (after start_writer()), then runs the handler in a child."""
        if claim.task.status is TaskStatus.RUNNING:  # started by the claim itself (Redis)
            return self._begin(claim, claim)
        if claim.deadline_at is not None and self._past_deadline(claim):
            return self._expire(claim)
        try:
            started = self._starts.submit(claim)
        except Exception:
            self.hand_back([claim])
            raise
        return self._begin(claim, started)

    def start_many(self, claims: list[Claim]) -> list[Claim | None]:
        """Start claims that pool threads run at once (the thread pool's ``start``), in one
        write: each as started; as it was when past its deadline (``begin`` times it out) or
        started by the claim already; None when it is no longer ours, or when its start failed
        even on a new connection (the claim is then handed back)."""
        outcomes: list[Claim | None] = list(claims)
        now = self.executor.clock.now
        due = [
            index
            for index, claim in enumerate(claims)
            if claim.task.status is not TaskStatus.RUNNING
            and (claim.deadline_at is None or now() < claim.deadline_at)
        ]
        # Usually every one of them.
        to_start = claims if len(due) == len(claims) else [claims[index] for index in due]
        if not to_start:
            return outcomes
        try:
            started: list[Claim | BaseException | None] = list(self._start_many(to_start))
        except Exception as exc:
            if len(to_start) > 1 and _refused(exc):  # the others' starts are still written
                started = [self._start_alone(claim) for claim in to_start]
            else:
                started = [exc] * len(to_start)
        pairs = list(zip(to_start, started, strict=True))
        failed = [claim for claim, item in pairs if isinstance(item, Exception)]
        if failed:
            logger.warning(
                "could not start %d tasks (%s); handing their claims back",
                len(failed),
                next(item for item in started if isinstance(item, Exception)),
            )
            self.hand_back(failed)
        for index, item in zip(due, started, strict=True):
            outcomes[index] = None if isinstance(item, BaseException) else item
        return outcomes

    def _start_alone(self, claim: Claim) -> Claim | BaseException | None:
        try:
            return self._start_many([claim])[0]
        except Exception as exc:
            return exc

    def begin_many(self, claims: list[Claim]) -> list[Begun | TaskStatus | None]:
        """Start ``claims`` in as few storage writes as they fit (the event loop's way in):
        for each, what to call, or the status recorded instead (None: not ours any more, or
        its start failed and the claim was handed back)."""
        self._writer()
        outcomes: list[Begun | TaskStatus | None] = [None] * len(claims)
        due: list[int] = []
        for index, claim in enumerate(claims):
            if claim.is_started:  # by the claim itself
                outcomes[index] = self._alone(claim, self._begin, claim, claim)
            elif self._past_deadline(claim):
                outcomes[index] = self._alone(claim, self._expire, claim)
            else:
                due.append(index)
        started = self._starts.submit_many([claims[index] for index in due])
        failed = [
            claims[i]
            for i, item in zip(due, started, strict=True)
            if isinstance(item, BaseException)
        ]
        if failed:
            logger.warning(
                "could not start %d tasks (%s); handing their claims back",
                len(failed),
                next(item for item in started if isinstance(item, BaseException)),
            )
            self.hand_back(failed)
        for index, item in zip(due, started, strict=True):
            if not isinstance(item, BaseException):
                outcomes[index] = self._alone(claims[index], self._begin, claims[index], item)
        return outcomes

    @staticmethod
    def _alone(claim: Claim, step: Callable[..., Any], *args: Any) -> Any:
        """One claim's step of a batch: its error is logged and costs only this claim (None:
        its lease expires and it is recovered), never the others."""
        try:
            return step(*args)
        except StorageUnavailableError as exc:
            logger.warning(
                "task %s: %s; the claim is recovered once its lease expires", claim.task_id, exc
            )
        except Exception:
            logger.exception("task %s: unexpected error in the worker", claim.task_id)
        return None

    def _writer(self) -> CompletionWriter:
        if self.writer is None:
            raise RuntimeError("TaskRunner.run() needs start_writer() first")
        return self.writer

    def _past_deadline(self, claim: Claim) -> bool:
        return claim.deadline_at is not None and self.executor.clock.now() >= claim.deadline_at

    def _expire(self, claim: Claim) -> TaskStatus | None:
        """A claim past its deadline before it started: TIMEOUT without running it."""
        expired = self.storage.expire_claim(claim)
        if expired is None:
            return None
        self.executor.announcer.transition(expired)
        return expired.status

    def _begin(self, claim: Claim, started: Claim | None) -> Begun | TaskStatus | None:
        """After the start write: find the handler and convert the parameter."""
        if started is None:
            logger.debug("task %s: claim no longer valid, not started", claim.task_id)
            return None
        # Found first: a resolver may import the task's module, and receivers of the started
        # signal (the Django Tasks backend's) look the handler up.
        task = started.task
        handler = resolve_handler(task.task_name)
        self.executor.announcer.starting(task)  # its metrics: at its start write
        if handler is None:
            return self.failures.record_error(
                started,
                f"no handler is registered for task name {task.task_name!r} in this worker",
            )
        parameter, param_type = task.parameter, handler.param_type
        if param_type is not None:  # (None: the parameter as stored, without a call)
            try:
                parameter = from_json_value(parameter, param_type)
            except ConversionError as exc:
                why = f"parameter does not fit param_type: {exc}"
                return self.failures.record_error(started, why)
        begun = object.__new__(Begun)  # build(), without its call: once per task
        begun.__dict__.update(claim=started, handler=handler, parameter=parameter)
        return begun

    def hand_back(self, claims: list[Claim]) -> None:
        """Starts that failed even on a new connection: give the claims back at once rather
        than after their leases expire. Safe if a start did commit (only its reply was lost):
        a hand-back changes only tasks that have not started, under the claim's token."""
        try:
            with_reconnect(lambda: self.storage.release(claims))
        except Exception:
            logger.debug(
                "tasks %s: could not hand the claims back",
                ", ".join(claim.task_id for claim in claims),
                exc_info=True,
            )

    def lose(self, claims: list[Claim], why: str) -> None:
        """Claims whose pool thread died under them: a started one's attempt fails (retryable,
        as a crashed worker's would), one not started is handed back."""
        unstarted = [claim for claim in claims if not claim.is_started]
        if unstarted:
            self.hand_back(unstarted)
        for claim in claims:
            if claim.is_started:
                try:
                    with_reconnect(functools.partial(self.record_failure, claim, why, True))
                except Exception:
                    logger.exception("task %s: could not record its lost attempt", claim.task_id)

    def open_context(self, begun: Begun, *, always: bool = False) -> TaskContext | None:
        """The handler's TaskContext (registered, so the heartbeat can mark it cancelled), if it
        takes one or ``always``."""
        claim = begun.claim
        if not (begun.handler.takes_context or always):
            return None
        context = TaskContext(
            claim.task,
            claim.deadline_at,
            self.executor,
            lambda progress: self.report_progress(claim, progress),
            Checkpoints(claim, self.executor, self.lease_seconds, self.stopping.is_set),
            asynchronous=begun.handler.is_async,
        )
        self.contexts[claim.task_id] = context
        return context

    def report_progress(self, claim: Claim, progress: Progress) -> None:
        """Keep a handler's progress report for the progress writer (no I/O here)."""
        self.progress.put(claim.task_id, (claim, progress))

    def finish_progress(self, claim: Claim) -> None:
        """Write the claim's last progress report now, before its outcome is recorded (a
        report written after it would be refused, the task no longer RUNNING)."""
        self.progress.finish(claim.task_id)

    @staticmethod
    def arguments(
        begun: Begun, context: TaskContext | None
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments of the handler's call."""
        handler = begun.handler
        args = (begun.parameter,) if handler.accepts_parameter else ()
        kwargs: dict[str, Any] = {"context": context} if handler.takes_context else {}
        return args, kwargs

    def _call(
        self, begun: Begun, writer: CompletionWriter, attempt: Attempt | None = None
    ) -> TaskStatus | None:
        claim, handler = begun.claim, begun.handler
        context = self.open_context(begun) if handler.takes_context else None
        args = (begun.parameter,) if handler.accepts_parameter else ()
        seconds = attempt_timeout_of(claim.task, handler)
        limit = None
        if seconds is not None:
            expire = functools.partial(ask_to_stop, claim, seconds, context)
            limit = self.limits.arm(seconds, expire)
        began = time.monotonic()
        self.running_threads[claim.task_id] = (threading.get_ident(), claim)
        try:
            value = handler.func(*args) if context is None else handler.func(*args, context=context)
            if value is not None and inspect.isawaitable(value):
                from asgiref.sync import async_to_sync

                async def wait(awaitable: Any = value) -> Any:
                    return await awaitable

                value = async_to_sync(wait)()
        except BaseException as exc:  # noqa: BLE001 - every failure is recorded, never lost
            # KeyboardInterrupt and SystemExit too: in a pool thread they can only come from
            # the handler (signals reach the main thread, whose handler sets an Event), and
            # let through they would end this thread and strand its task.
            if context is not None:  # only a handler with a context reports progress
                self.finish_progress(claim)  # before the outcome: written after, it is refused
            expired = limit is not None and self.limits.finish(limit)
            return self._raised(begun, exc, limit if expired else None, began, attempt)
        finally:
            self.running_threads.pop(claim.task_id, None)
            if context is not None:
                self.contexts.pop(claim.task_id, None)
        if context is not None:
            self.finish_progress(claim)
        if limit is not None and self.limits.finish(limit):
            took = time.monotonic() - began
            returned = f"the handler returned after {took:.2f} s; what it returned was discarded"
            return self.record_timed_out(claim, limit.seconds, returned, attempt)
        refusal = hand_over(claim, value, writer)
        if refusal is not None:
            if attempt is not None:
                attempt.failed(error=refusal)
            return self.record_failure(claim, refusal, False)
        return TaskStatus.COMPLETED  # recorded shortly, by the writer

    def _raised(
        self,
        begun: Begun,
        exc: BaseException,
        expired: AttemptLimit | None,
        began: float,
        attempt: Attempt | None,
    ) -> TaskStatus | None:
        """Record what the handler raised (inside its except block: the traceback is read from
        there): a durable wait or a stop hands the task back, unless its attempt expired."""
        claim = begun.claim
        if isinstance(exc, Suspended) and expired is None:  # a durable wait, or a stop
            return self.failures.suspend(claim, exc.wait, attempt)
        if expired is not None:
            took = time.monotonic() - began
            raised = (
                f"the handler reached a wait after {took:.2f} s, too late to wait"
                if isinstance(exc, Suspended)
                else f"the handler raised after {took:.2f} s:\n{traceback.format_exc()}"
            )
            return self.record_timed_out(claim, expired.seconds, raised, attempt)
        if attempt is not None:
            attempt.failed(exc)
        retryable = isinstance(exc, begun.handler.retry_on)
        return self.record_failure(claim, traceback.format_exc(), retryable, exc=exc)

    def suspend(
        self, claim: Claim, wait: Wait | None, attempt: Attempt | None = None
    ) -> TaskStatus | None:
        """See FailureRecorder.suspend."""
        return self.failures.suspend(claim, wait, attempt)

    # -- failures (see failures.py) -------------------------------------------------------
    def record_failure(
        self,
        claim: Claim,
        error: str,
        retryable: bool,
        *,
        is_error: bool = False,
        exc: BaseException | None = None,
    ) -> TaskStatus | None:
        """See FailureRecorder.record_failure."""
        return self.failures.record_failure(claim, error, retryable, is_error=is_error, exc=exc)

    def record_timed_out(
        self, claim: Claim, seconds: float, what_happened: str, attempt: Attempt | None = None
    ) -> TaskStatus | None:
        """See FailureRecorder.record_timed_out."""
        return self.failures.record_timed_out(claim, seconds, what_happened, attempt)
