"""The worker's event loop: runs async handlers as asyncio tasks on one thread, beside the pool."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async

from .connections import tidy_connections
from .exceptions import StorageUnavailableError
from .execution import Begun, TaskRunner
from .observing import Attempt, observe
from .records import Claim
from .retries import timeout_message

logger = logging.getLogger("django_reliable_executor")

CANCELLED = (
    "cancelled by the worker: a cancel was requested, the task timed out or this attempt "
    "lost its lease"
)
TIMED_OUT = "timeout"
# Failures are recorded with a blocking storage call, so off the loop, in a few threads.
BLOCKING_THREADS = 4
# The loop's timers may fire a hair before the wall clock reaches the deadline; the storage
# records TIMEOUT only past it.
DEADLINE_MARGIN = 0.005

Done = Callable[[Claim], None]


class EventLoop:
    """One asyncio loop on a thread of its own, started with the first async claim.

    ``run(claims, done)``, called by the pool's async feeder thread, starts the claims through
    the runner (the same batched start write as pool threads) and runs each handler as an
    asyncio task; ``done(claim)`` is called once its outcome is recorded or handed to the
    completion writer. A cancel request, a lost lease (both passed on by the heartbeat, through
    the TaskContext) and the task's deadline cancel the handler's asyncio task: it gets
    ``CancelledError`` at its next ``await``, and the failure is recorded as a thread's would
    be, so the storage ends the task CANCELLED or TIMEOUT (or drops an outcome no longer ours).
    """

    def __init__(self, runner: TaskRunner) -> None:
        self.runner = runner
        self.loop: asyncio.AbstractEventLoop | None = None  # made with its thread
        self._tasks: set[asyncio.Task[None]] = set()  # referenced until they end
        self._blocking = ThreadPoolExecutor(
            BLOCKING_THREADS, thread_name_prefix="reliable-executor-async-io"
        )
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # -- the feeder's side ----------------------------------------------------------------
    def run(self, claims: list[Claim], done: Done) -> None:
        """Start ``claims`` and hand their handlers to the loop; never raises: a claim that
        does not reach the loop is ``done`` at once."""
        loop = self._ensure_started()
        try:
            begun = self.runner.begin_many(claims)
        except Exception as exc:
            _log_error(claims, exc)
            begun = [None] * len(claims)
        finally:
            tidy_connections()
        ready: list[tuple[Claim, Begun]] = []
        for claim, item in zip(claims, begun, strict=True):
            if isinstance(item, Begun):
                ready.append((claim, item))
            else:
                done(claim)
        if ready:
            loop.call_soon_threadsafe(self._spawn, ready, done)

    def stop(self) -> None:
        """Stop the loop (the pool is idle); a hard stop leaves it to die with the process."""
        with self._start_lock:
            loop, thread = self.loop, self._thread
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(5.0)
            if not thread.is_alive():
                loop.close()
        self._blocking.shutdown(wait=False)

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self.loop is None:
                self.loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self.loop.run_forever, name="reliable-executor-event-loop", daemon=True
                )
                self._thread.start()
            return self.loop

    # -- the loop's side ------------------------------------------------------------------
    def _spawn(self, ready: list[tuple[Claim, Begun]], done: Done) -> None:
        loop = asyncio.get_running_loop()
        for claim, begun in ready:
            task = loop.create_task(self._execute(claim, begun, done))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _execute(self, claim: Claim, begun: Begun, done: Done) -> None:
        try:
            attempt = observe(begun.claim.task)
            if attempt is None:  # no span recorded, no Sentry: nothing to open
                await self._attempt(begun, None)
            else:
                with attempt:  # this asyncio task's context: the handler's task inherits it
                    await self._attempt(begun, attempt)
        except Exception as exc:
            _log_error([claim], exc)
        finally:
            done(claim)

    async def _attempt(self, begun: Begun, attempt: Attempt | None) -> None:
        """Run the handler, then record its failure if it failed."""
        failure = await self._call(begun, attempt)
        if failure is None:
            return
        # Handlers reach the ORM through sync_to_async, in asgiref's one thread for
        # thread-sensitive calls, which no pool thread tidies: a connection the server
        # killed stays there, and fails every later ORM call of every async handler,
        # until closed. A failure may come from one: tidy that thread, as a pool thread
        # tidies its own after each task, before the retry can run into it.
        await sync_to_async(tidy_connections)()
        # Recorded in this context (the span and Sentry scope of the attempt, if any): the
        # log line of the outcome belongs to the attempt.
        record = contextvars.copy_context().run
        await asyncio.get_running_loop().run_in_executor(
            self._blocking, record, self._record_failure, begun, *failure
        )

    async def _call(
        self, begun: Begun, attempt: Attempt | None
    ) -> tuple[str, bool, BaseException | None] | None:
        """Await the handler: None once its result is with the completion writer, else the
        failure to record (error, retryable, the handler's exception when it raised)."""
        runner, claim, handler = self.runner, begun.claim, begun.handler
        loop = asyncio.get_running_loop()
        # Always made: the heartbeat marks it cancelled, which cancels the coroutine.
        context = runner.open_context(begun, always=True)
        args, kwargs = runner.arguments(begun, context)
        stopped: list[str] = []  # why the worker cancelled the handler, if it did
        timer: asyncio.TimerHandle | None = None
        try:
            handler_task = loop.create_task(handler.func(*args, **kwargs))

            def stop(why: str) -> None:
                if not handler_task.done() and not stopped:
                    stopped.append(why)
                    handler_task.cancel()

            def stop_soon() -> None:  # from the heartbeat's thread, say
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(stop, CANCELLED)

            if context is not None:
                context.on_cancel(stop_soon)
            if claim.deadline_at is not None:
                left = (claim.deadline_at - runner.executor.clock.now()).total_seconds()
                timer = loop.call_later(max(left, 0) + DEADLINE_MARGIN, stop, TIMED_OUT)
            value = await handler_task
        except BaseException as exc:  # noqa: BLE001 - every failure is recorded, never lost
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            failure: tuple[str, bool, BaseException | None]
            if stopped == [TIMED_OUT]:
                await self._past(claim)
                failure = timeout_message(claim.task.max_duration_millis, None), False, None
            elif stopped:
                failure = CANCELLED, False, None
            else:
                failure = traceback.format_exc(), isinstance(exc, handler.retry_on), exc
            if attempt is not None:
                attempt.failed(None if stopped else exc, error=failure[0])
            return failure
        finally:
            if timer is not None:
                timer.cancel()
            runner.contexts.pop(claim.task_id, None)
            # The last progress report before the outcome (written after, it is refused); off
            # the loop, and only when one is pending: most tasks pay nothing here.
            if runner.progress.pending(claim.task_id):
                await loop.run_in_executor(self._blocking, runner.finish_progress, claim)
            else:
                runner.progress.forget(claim.task_id)
        writer = runner.writer
        assert writer is not None  # begin_many() refuses to start without it
        refusal = runner.hand_over(claim, value, writer)
        if refusal is None:
            return None
        if attempt is not None:
            attempt.failed(error=refusal)
        return refusal, False, None

    async def _past(self, claim: Claim) -> None:
        """Wait until the storage's clock, too, has passed the claim's deadline."""
        assert claim.deadline_at is not None
        left = (claim.deadline_at - self.runner.executor.clock.now()).total_seconds()
        if left > 0:
            await asyncio.sleep(left + DEADLINE_MARGIN)

    # -- the blocking threads' side -------------------------------------------------------
    def _record_failure(
        self, begun: Begun, error: str, retryable: bool, exc: BaseException | None
    ) -> Any:
        try:
            return self.runner.record_failure(begun.claim, error, retryable, exc=exc)
        finally:
            tidy_connections()


def _log_error(claims: list[Claim], exc: Exception) -> None:
    ids = ", ".join(claim.task_id for claim in claims)
    if isinstance(exc, StorageUnavailableError):
        logger.warning("tasks %s: %s; the claims are recovered once their leases expire", ids, exc)
    else:
        logger.error("tasks %s: unexpected error in the worker", ids, exc_info=exc)
