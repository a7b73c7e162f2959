"""The worker's event loop: runs async handlers as asyncio tasks on one thread, beside the pool."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async

from ..connections import tidy_connections
from ..core.records import Claim
from ..core.retries import attempt_timeout_message, timeout_message
from ..core.stacks import format_coroutine_stack
from ..exceptions import StorageUnavailableError
from ..observability.attempts import Attempt, observe
from .attempt_limits import attempt_timeout_of
from .completion_writer import hand_over
from .coroutine_stops import (
    ATTEMPT_TIMED_OUT,
    CANCELLED,
    DEADLINE_MARGIN,
    TIMED_OUT,
    HandlerExit,
    arm_stops,
    contained,
)
from .loop_stacks import LoopBusy, read_on_loop
from .runner import Begun, TaskRunner
from .suspended import Suspended

logger = logging.getLogger("django_reliable_executor")

# Failures are recorded with a blocking storage call, so off the loop, in a few threads.
BLOCKING_THREADS = 4
LOOP_DIED = "the worker's event loop died"

Done = Callable[[Claim], None]


@dataclasses.dataclass
class _Held:
    """A claim handed to the loop and not yet done: as started (None until it is), the loop it
    went to, and whom to tell once it is done."""

    claim: Claim
    started: Claim | None
    loop: asyncio.AbstractEventLoop
    done: Done


class EventLoop:
    """One asyncio loop on a thread of its own, started with the first async claim.

    ``run(claims, done)``, called by the pool's async feeder thread, starts the claims through
    the runner (the same batched start write as pool threads) and runs each handler as an
    asyncio task; ``done(claim)`` is called once its outcome is recorded or handed to the
    completion writer. A cancel request, a lost lease (both passed on by the heartbeat, through
    the TaskContext) and the task's deadline cancel the handler's asyncio task: it gets
    ``CancelledError`` at its next ``await``, and the failure is recorded as a thread's would
    be, so the storage ends the task CANCELLED or TIMEOUT (or drops an outcome no longer ours).
    So does its attempt_timeout, and once the coroutine has ended (however it ended) the
    attempt is recorded as a failed, retryable one.
    """

    def __init__(self, runner: TaskRunner, *, stall_seconds: float = 30.0) -> None:
        self.runner = runner
        # A loop that runs no callback for this long (a handler blocks it) is reported by
        # supervise(): the worker then stops registering, so that health reports it.
        self.stall_seconds = stall_seconds
        self._ping_sent: float | None = None  # monotonic time of the ping not answered yet
        self.loop: asyncio.AbstractEventLoop | None = None  # made with its thread
        # Every claim handed to a loop and not yet done: what supervise() fails or hands back
        # when that loop's thread died.
        self._held: dict[str, _Held] = {}
        self._held_lock = threading.Lock()
        self._stopped = False
        self._death: str | None = None  # what ended the current loop's thread, if it ended
        self.deaths = 0  # loop threads found dead (and replaced) so far
        self._tasks: set[asyncio.Task[None]] = set()  # referenced until they end
        # Each running handler's own asyncio task by task id (the loop's thread alone
        # touches it): where coroutine_stacks() reads its coroutine's frames.
        self._handlers: dict[str, asyncio.Task[Any]] = {}
        self._blocking = ThreadPoolExecutor(
            BLOCKING_THREADS, thread_name_prefix="reliable-executor-async-io"
        )
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # -- the feeder's side ----------------------------------------------------------------
    def run(self, claims: list[Claim], done: Done) -> None:
        """Start ``claims`` and hand their handlers to the loop; never raises: a claim that
        does not reach the loop is ``done`` at once."""
        thread = self._thread
        if thread is not None and not thread.is_alive():  # died since the last heartbeat
            self.supervise()
        loop = self._ensure_started()
        with self._held_lock:
            for claim in claims:
                self._held[claim.task_id] = _Held(claim, None, loop, done)
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
                with self._held_lock:
                    held = self._held.get(claim.task_id)
                    if held is not None:
                        held.started = item.claim
            else:
                self._forget(claim)
                done(claim)
        if ready:
            try:
                loop.call_soon_threadsafe(self._spawn, ready, done)
            except RuntimeError:  # closed: its thread died, supervise() fails the claims
                logger.warning("the event loop is gone; its claims are failed by its supervisor")

    def supervise(self) -> str | None:
        """The heartbeat's check of the loop's thread: once it has died (whatever ended it),
        fail the attempts it held (retryable; a claim not yet started is handed back) and
        start a new loop (raises when it cannot). What is wrong now, or None: a loop that has
        run no callback for ``stall_seconds`` (a handler blocks it) cannot be replaced."""
        with self._start_lock:
            thread, loop = self._thread, self.loop
            if self._stopped or thread is None or loop is None:
                return None
            if thread.is_alive():
                return self._stalled(loop)
            # The next claims get a new loop; the dead one's are failed below.
            self.loop = self._thread = None
            self.deaths += 1
        why = f"{LOOP_DIED}: {self._death or 'its thread ended'}"
        logger.error("%s; failing the attempts it held and starting a new loop", why)
        with self._held_lock:
            lost = [held for held in self._held.values() if held.loop is loop]
            for held in lost:
                del self._held[held.claim.task_id]
        for held in lost:
            self._lose(held, why)
        if loop is not None:
            with contextlib.suppress(Exception):
                loop.close()
        self._ensure_started()
        return None

    def _stalled(self, loop: asyncio.AbstractEventLoop) -> str | None:
        """Ping the loop (one ping at a time): how long the last one has waited, once that is
        more than ``stall_seconds``."""
        now = time.monotonic()
        sent = self._ping_sent
        if sent is None:
            self._ping_sent = now
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(self._answer)
            return None
        if now - sent > self.stall_seconds:
            return (
                f"the worker's event loop has run nothing for {now - sent:.1f}s: a handler "
                "blocks it (a synchronous call in an async def handler)"
            )
        return None

    def _answer(self) -> None:
        self._ping_sent = None

    def coroutine_stacks(
        self, task_ids: list[str], timeout: float
    ) -> dict[str, tuple[str, bool]] | None:
        """The stacks of these tasks' handler coroutines (``format_coroutine_stack``), read
        on the loop's thread (``read_on_loop``): each id's, none for an id not running here.
        None when the loop did not get to it within ``timeout`` seconds: a handler blocks it
        (its thread's frames say where)."""
        loop = self.loop
        if loop is None:
            return {}

        def read() -> dict[str, tuple[str, bool]]:
            handlers = {t: self._handlers.get(t) for t in task_ids}
            return {
                t: format_coroutine_stack(task.get_coro())
                for t, task in handlers.items()
                if task is not None and not task.done()
            }

        try:
            return read_on_loop(loop, read, timeout)
        except RuntimeError:  # closed meanwhile: its handlers are gone
            return {}
        except LoopBusy:
            return None

    def loop_thread_ident(self) -> int | None:
        """The ident of the loop's thread (None before it started)."""
        thread = self._thread
        return thread.ident if thread is not None else None

    def started_claim(self, task_id: str) -> Claim | None:
        """The claim of ``task_id`` as started, while its handler is on the loop."""
        with self._held_lock:
            held = self._held.get(task_id)
        return held.started if held is not None else None

    def _lose(self, held: _Held, why: str) -> None:
        try:
            if held.started is None:
                self.runner.hand_back([held.claim])
            else:
                self.runner.record_failure(held.started, why, True)
        except Exception:
            logger.exception("task %s: could not record its lost attempt", held.claim.task_id)
        finally:
            tidy_connections()
            held.done(held.claim)

    def _forget(self, claim: Claim) -> None:
        with self._held_lock:
            self._held.pop(claim.task_id, None)

    def stop(self) -> None:
        """Stop the loop (the pool is idle); a hard stop leaves it to die with the process."""
        with self._start_lock:
            self._stopped = True
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
                self._death = None
                self._ping_sent = None
                self.loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._serve,
                    args=(self.loop,),
                    name="reliable-executor-event-loop",
                    daemon=True,
                )
                self._thread.start()
            return self.loop

    def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's thread. A handler's SystemExit or KeyboardInterrupt never gets here
        (see HandlerExit); whatever else ends the loop is said, and supervise() replaces it."""
        try:
            loop.run_forever()
        except BaseException as exc:  # noqa: BLE001 - said here, replaced by supervise()
            self._death = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            logger.error("the worker's event loop died", exc_info=exc)

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
            self._forget(claim)
            done(claim)

    async def _attempt(self, begun: Begun, attempt: Attempt | None) -> None:
        """Run the handler, then record its wait or its failure, if it did not complete."""
        outcome = await self._call(begun, attempt)
        if outcome is None:
            return
        if not isinstance(outcome, Suspended):
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
            self._blocking, record, self._record, begun, outcome, attempt
        )

    async def _call(
        self, begun: Begun, attempt: Attempt | None
    ) -> tuple[str, bool, BaseException | None] | Suspended | None:
        """Await the handler: None once its result is with the completion writer, Suspended
        when it stopped to wait, else the failure to record (error, retryable, the handler's
        exception when it raised)."""
        runner, claim, handler = self.runner, begun.claim, begun.handler
        loop = asyncio.get_running_loop()
        # Always made: the heartbeat marks it cancelled, which cancels the coroutine.
        context = runner.open_context(begun, always=True)
        args, kwargs = runner.arguments(begun, context)
        stopped: list[str] = []  # why the worker cancelled the handler, if it did
        timers: list[asyncio.TimerHandle] = []
        seconds = attempt_timeout_of(claim.task, handler)
        began = loop.time()
        try:
            handler_task = loop.create_task(contained(handler.func(*args, **kwargs)))
            self._handlers[claim.task_id] = handler_task
            now = runner.executor.clock.now()
            arm_stops(loop, handler_task, begun, context, seconds, stopped, timers, now)
            value = await handler_task
        except BaseException as exc:  # noqa: BLE001 - every failure is recorded, never lost
            if isinstance(exc, HandlerExit):  # the handler's own SystemExit, say
                exc = exc.original
            if isinstance(exc, Suspended) and not stopped:  # a durable wait, or a stop
                return exc
            failure = await self._failure(exc, stopped, begun, seconds, loop.time() - began)
            if attempt is not None:
                attempt.failed(None if stopped else exc, error=_summary(failure[0], stopped))
            return failure
        finally:
            for timer in timers:
                timer.cancel()
            self._handlers.pop(claim.task_id, None)
            runner.contexts.pop(claim.task_id, None)
            # The last progress report before the outcome (written after, it is refused); off
            # the loop, and only when one is pending: most tasks pay nothing here.
            if runner.progress.pending(claim.task_id):
                await loop.run_in_executor(self._blocking, runner.finish_progress, claim)
            else:
                runner.progress.forget(claim.task_id)
        if stopped == [ATTEMPT_TIMED_OUT]:  # it caught its CancelledError, then returned
            assert seconds is not None
            error = attempt_timeout_message(seconds, _returned_late(loop.time() - began))
            if attempt is not None:
                attempt.failed(error=_summary(error, stopped))
            return error, True, None
        writer = runner.writer
        assert writer is not None  # begin_many() refuses to start without it
        refusal = hand_over(claim, value, writer)
        if refusal is None:
            return None
        if attempt is not None:
            attempt.failed(error=refusal)
        return refusal, False, None

    async def _failure(
        self,
        exc: BaseException,
        stopped: list[str],
        begun: Begun,
        seconds: float | None,
        took: float,
    ) -> tuple[str, bool, BaseException | None]:
        """The failure to record for a handler that raised ``exc`` (after ``took`` seconds):
        stopped at its deadline, at its attempt_timeout, by a cancel, or its own error."""
        claim = begun.claim
        if stopped == [TIMED_OUT]:
            await self._past(claim)
            return timeout_message(claim.task.max_duration_millis, None), False, None
        if stopped == [ATTEMPT_TIMED_OUT]:
            assert seconds is not None
            why = f"its coroutine was cancelled; it ended after {took:.2f} s"
            return attempt_timeout_message(seconds, why), True, None
        if stopped:
            return CANCELLED, False, None
        error = "".join(traceback.format_exception(exc))
        return error, isinstance(exc, begun.handler.retry_on), exc

    async def _past(self, claim: Claim) -> None:
        """Wait until the storage's clock, too, has passed the claim's deadline."""
        assert claim.deadline_at is not None
        left = (claim.deadline_at - self.runner.executor.clock.now()).total_seconds()
        if left > 0:
            await asyncio.sleep(left + DEADLINE_MARGIN)

    # -- the blocking threads' side -------------------------------------------------------
    def _record(
        self,
        begun: Begun,
        outcome: tuple[str, bool, BaseException | None] | Suspended,
        attempt: Attempt | None,
    ) -> Any:
        """Write a handler's wait (a suspend) or its failure, fenced by the claim's token."""
        try:
            if isinstance(outcome, Suspended):
                return self.runner.suspend(begun.claim, outcome.wait, attempt)
            error, retryable, exc = outcome
            return self.runner.record_failure(begun.claim, error, retryable, exc=exc)
        finally:
            tidy_connections()


def _returned_late(took: float) -> str:
    """What became of a handler that caught its attempt's cancel, then returned."""
    return (
        f"its coroutine was cancelled, yet returned after {took:.2f} s; what it returned was "
        "discarded"
    )


def _summary(error: str, stopped: list[str]) -> str:
    """What a failure's span says: an attempt timed out by its first line (what follows says
    what became of the handler), any other failure as it is."""
    return error.splitlines()[0] if stopped == [ATTEMPT_TIMED_OUT] else error


def _log_error(claims: list[Claim], exc: Exception) -> None:
    ids = ", ".join(claim.task_id for claim in claims)
    if isinstance(exc, StorageUnavailableError):
        logger.warning("tasks %s: %s; the claims are recovered once their leases expire", ids, exc)
    else:
        logger.error("tasks %s: unexpected error in the worker", ids, exc_info=exc)
