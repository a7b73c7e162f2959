"""The process pool (``runexecutor --pool process``): pool threads hand their tasks to child
processes (two threads per child) and wait for the outcome, so the worker keeps claiming,
heartbeating and writing outcomes whatever a handler does, and can end a handler at once by
terminating its child.

The worker process takes an idle child, then starts the task (its start write: only now, so
that a rate limit counts when the handler can begin), sends the child the task as JSON and
waits. The wait lets the GIL go, so a handler holding the
GIL in its child costs the worker nothing. Past the task's deadline, or once a cancel is
requested (or the lease lost), the child gets SIGTERM, then SIGKILL after ``GRACE_SECONDS``, and
the failed attempt is recorded: the storage ends it TIMEOUT or CANCELLED, as it does a thread's.
Past the attempt's ``attempt_timeout`` likewise: the attempt then counts as a failed, retryable
one ("attempt timed out after N s").
A child that dies is replaced, and its task counts a failed (retryable) attempt.

Children are started with the "spawn" method (fork after threads and open connections is
unsafe), set Django up from the worker's settings module and share nothing with the worker:
a handler that uses the database opens its own connection there.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..core.progress import progress_from_json
from ..core.records import Claim
from ..core.retries import attempt_timeout_message, timeout_message
from ..core.serialization import Encoded, dumps
from ..core.states import TaskStatus
from ..core.task_json import task_to_json
from ..observability import metrics
from ..observability.attempts import Attempt, observe
from .attempt_limits import attempt_timeout_of, log_attempt_expired
from .children import GRACE_SECONDS, Child, ChildDied
from .context import TaskContext
from .runner import Begun, TaskRunner
from .waits import wait_from_json

logger = logging.getLogger("django_reliable_executor")

WAIT_STEP = 0.1  # how often a waiting pool thread looks at the cancel flag and the clock
# A handler running longer than this: read the task's cancel flag from the storage too (at
# most once a second, TaskContext.is_cancelled), not only when the heartbeat brings it.
READ_CANCEL_AFTER = 1.0
# The storage's clock may be a hair behind ours: TIMEOUT is recorded only past the deadline.
DEADLINE_MARGIN = 0.005
RECORD_SECONDS = 5.0  # most close() waits for the attempts of the children it stopped
STARTUP_SECONDS = 120.0  # most a child may take to set Django up when the worker starts
TERMINATED = "the child process running the handler was terminated"


class ProcessPool:
    """``size`` children, each replaced after ``max_tasks_per_child`` tasks (None: never) or
    when it dies or is stopped. ``run(claim)`` is the pool threads' entry point, in place of
    ``TaskRunner.run``; the pool has ``threads`` of them, two per child: while one waits on the
    child's handler, the other waits with the next task for the child, and takes it as soon as
    it is back, while the first records the outcome."""

    def __init__(
        self, runner: TaskRunner, *, size: int, max_tasks_per_child: int | None = None
    ) -> None:
        from django.conf import settings

        self.settings_module = settings.SETTINGS_MODULE
        if not self.settings_module:
            raise ImproperlyConfigured(
                "--pool process needs DJANGO_SETTINGS_MODULE: its child processes load the "
                "settings from that module (settings.configure() cannot reach them)"
            )
        self.runner = runner
        self.size = size
        self.max_tasks_per_child = max_tasks_per_child
        self._context = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)  # a child became idle, or the pool closed
        self._idle: list[Child] = []
        self._children: set[Child] = set()
        self._closed = False
        self._quiet = False  # the worker is stopping: tasks not started yet are handed back
        self._started = False
        self._in_flight = 0  # tasks started by run() whose outcome is not recorded yet
        # Pool threads in run() that took a child (running on it, or back from it and
        # recording the outcome): what free_children() does not count as wanting one.
        self._served = 0
        # The child running each task's handler, with the claim as started (stack requests,
        # stacks.py); and who takes the children's stack replies.
        self.running: dict[str, tuple[Child, Claim]] = {}
        self.on_stack: Callable[[Claim, dict[str, Any]], object] | None = None

    @property
    def threads(self) -> int:
        """Pool threads to run: two per child."""
        return 2 * self.size

    def free_children(self, held: int) -> int:
        """Children free to start a task now, given ``held``: the claims the pool's threads
        hold or queue (``BoundedPool.thread_claims()``, read before this call). The idle
        children and those missing (a thread that wants one starts it), less the claims that
        will take one before anything claimed now: queued, or in a thread that has not got a
        child yet. The fetcher claims fair names only for these (fetcher.py): each child has
        two threads, and a claim for the second would wait in it for the child, claimed
        ahead of the other workers' turns. A thread that ends between the two reads still
        counts as wanting a child: the count errs low, never high."""
        with self._lock:
            if self._closed or self._quiet:
                return 0
            free = len(self._idle) + max(0, self.size - len(self._children))
            return max(0, free - max(0, held - self._served))

    def start(self, timeout: float = STARTUP_SECONDS) -> None:
        """Start every child and wait until each has set Django up (in parallel); once only.
        Raises ImproperlyConfigured, the children stopped, if one could not."""
        with self._lock:
            if self._started:
                return
            self._started = True
        children = [self._spawn() for _ in range(self.size)]
        try:
            for child in children:
                child.wait_ready(timeout)
        except ChildDied as exc:
            for child in children:
                self._forget(child)
                child.stop()
            raise ImproperlyConfigured(
                f"--pool process: a child process could not set Django up ({exc}); "
                "its error is in the output above"
            ) from None
        for child in children:
            self._give_back(child)

    # -- the pool threads' side -----------------------------------------------------------
    def run(self, claim: Claim) -> TaskStatus | None:
        """Take a child ready to run the handler, then start the claim, run the handler there
        and record the outcome; as TaskRunner.run. The start is written only once the child
        is ready: a start written while the task waits for a child would let the handlers of
        a rate limit begin in bursts (and its deadline run while it waits)."""
        try:
            child = self._take_ready()
        except ChildDied:  # stopping: not started, so handed back (the claim started it: run)
            if not claim.is_started:
                self.runner.hand_back([claim])
                return None
            child = None
        except Exception:  # no child could be started: give the task back at once
            if not claim.is_started:
                self.runner.hand_back([claim])
            raise
        if child is None:
            return self._run_on(claim, None)
        try:
            return self._run_on(claim, child)
        finally:
            with self._lock:
                self._served -= 1  # counted by _take(): this thread wants no child now

    def _run_on(self, claim: Claim, child: Child | None) -> TaskStatus | None:
        """run(), once ``child`` was taken (None: the pool stops, and the claim was started)."""
        try:
            begun = self.runner.begin(claim)
        except BaseException:
            if child is not None:
                self._give_back(child)
            raise
        if not isinstance(begun, Begun) or child is None:
            if child is not None:
                self._give_back(child)
            if isinstance(begun, Begun):  # stopping, and no child will run it
                reply = {"status": "died", "error": "the worker is stopping: not run"}
                return self._record(begun, reply, None)
            return begun
        with self._lock:
            self._in_flight += 1
        try:
            # The run span and Sentry scope live here, in the worker, around the child's run
            # (the child continues the span for the handler's own spans).
            attempt = observe(begun.claim.task)
            if attempt is None:
                return self._run_begun(begun, child, None)
            with attempt:
                return self._run_begun(begun, child, attempt)
        finally:
            with self._lock:
                self._in_flight -= 1
                self._freed.notify_all()  # close() may be waiting for the last outcomes

    def _take_ready(self) -> Child:
        """An idle child that has set Django up (a replacement may still be at it): one that
        cannot is stopped and another taken. ChildDied once the pool is closed."""
        while True:
            child = self._take()
            if child.ready:
                return child
            try:
                child.wait_ready(STARTUP_SECONDS)
                return child
            except ChildDied:
                logger.exception("a child process could not set Django up; starting another")
                with self._lock:
                    self._children.discard(child)
                    self._served -= 1  # counted by _take(): this thread wants another child
                child.stop()
            except BaseException:
                with self._lock:
                    self._served -= 1
                raise

    def _run_begun(self, begun: Begun, child: Child, attempt: Attempt | None) -> TaskStatus | None:
        runner, claim = self.runner, begun.claim
        # Always made: the heartbeat marks it on a cancel request or a lost lease.
        context = runner.open_context(begun, always=True)
        assert context is not None
        stop = threading.Event()
        context.on_cancel(stop.set)
        reusable = False
        self.running[claim.task_id] = (child, claim)
        try:
            reply = self._call(child, begun, context, stop, attempt)
            reusable = child.alive()  # not one the worker had to stop
        except ChildDied as exc:
            why = f"{TERMINATED}: the worker stopped" if self._closed else str(exc)
            reply = {"status": "died", "error": why}
        finally:
            self.running.pop(claim.task_id, None)
            runner.contexts.pop(claim.task_id, None)
            # Back before the outcome is written: the thread waiting for it sends its task now.
            self._put(child, reusable)
        runner.finish_progress(claim)  # the last report before the outcome (refused after)
        return self._record(begun, reply, attempt)

    def _call(
        self,
        child: Child,
        begun: Begun,
        context: TaskContext,
        stop: threading.Event,
        attempt: Attempt | None,
    ) -> dict[str, Any]:
        """Send the task, wait for the reply; {"status": "timeout" | "attempt_timeout" |
        "cancelled"} once the child had to be stopped, or when the task was over before it got
        a child."""
        claim = begun.claim
        deadline = claim.deadline_at
        if deadline is not None and self._seconds_to(deadline) <= 0:
            return {"status": "timeout"}
        if stop.is_set():
            return {"status": "cancelled"}
        message = {
            "task": task_to_json(claim.task),
            "deadline_at": deadline.isoformat() if deadline is not None else None,
            # What the child's durable steps write their checkpoints under (process_child.py).
            "claim": {"token": claim.token, "shard": claim.shard},
            "lease_seconds": self.runner.lease_seconds,
        }
        if attempt is not None:
            message["run_span"] = attempt.child_trace_context()
        seconds = attempt_timeout_of(claim.task, begun.handler)
        child.send(message)
        return self._await_reply(child, claim, context, stop, seconds)

    def _await_reply(
        self,
        child: Child,
        claim: Claim,
        context: TaskContext,
        stop: threading.Event,
        seconds: float | None,
    ) -> dict[str, Any]:
        """Wait for the child's reply to the task just sent, passing on its progress reports;
        stop the child at the task's deadline, at its attempt_timeout (``seconds``), or on a
        cancel request or a lost lease."""
        deadline = claim.deadline_at
        started = time.monotonic()
        ends = None if deadline is None else started + self._seconds_to(deadline)
        limit_ends = None if seconds is None else started + seconds
        # Woken at whichever comes first (and every WAIT_STEP, for the cancel flag).
        soonest = min((t for t in (ends, limit_ends) if t is not None), default=None)
        while True:
            step = WAIT_STEP
            if soonest is not None:
                step = max(0.0, min(WAIT_STEP, soonest - time.monotonic()))
            reply = child.receive(step)
            if reply is not None and reply["status"] == "progress":  # coalesced in the child
                progress = progress_from_json(reply["progress"])
                if progress is not None:
                    self.runner.report_progress(claim, progress)
            elif reply is not None and reply["status"] == "step":  # a checkpoint written there
                metrics.count_step_finished(claim.task)
            elif reply is not None and reply["status"] == "stack":  # asked by ask_stack()
                child.stack_answered(str(reply.get("request_id")))
                if self.on_stack is not None:
                    self.on_stack(claim, reply)
            elif reply is not None:
                return reply
            now = time.monotonic()
            why = None
            if ends is not None and now >= ends:
                why = "timeout"
            elif limit_ends is not None and now >= limit_ends:
                assert seconds is not None
                log_attempt_expired(claim, seconds, f"terminating its child process {child.pid}")
                child.stop()
                return {
                    "status": "attempt_timeout",
                    "error": attempt_timeout_message(seconds, TERMINATED),
                }
            elif stop.is_set() or (now - started >= READ_CANCEL_AFTER and context.is_cancelled()):
                why = "cancelled"
            if why is not None:
                logger.warning(
                    "task %s: %s; stopping its child process %s",
                    claim.task_id,
                    "past its deadline" if why == "timeout" else "cancelled or its lease lost",
                    child.pid,
                )
                child.stop()
                return {"status": why}

    def _seconds_to(self, moment: dt.datetime) -> float:
        return (moment - self.runner.executor.clock.now()).total_seconds()

    def _record(
        self, begun: Begun, reply: dict[str, Any], attempt: Attempt | None
    ) -> TaskStatus | None:
        """Record what the child answered, or why it has none."""
        runner, claim = self.runner, begun.claim
        status = reply["status"]
        if status == "suspend":  # a durable wait
            return runner.suspend(claim, wait_from_json(reply["wait"]), attempt)
        if attempt is not None and status != "ok":
            error = reply.get("error") or status
            # A timed-out attempt's span says so (its first line), not what became of it.
            attempt.failed(error=error.splitlines()[0] if status == "attempt_timeout" else error)
        if status == "ok":
            writer = runner.writer
            assert writer is not None  # the worker started it before any claim
            value = reply["result"]
            writer.put(claim, Encoded(value, dumps(value)))
            return TaskStatus.COMPLETED  # recorded shortly, by the writer
        if status == "error":
            return runner.record_failure(claim, reply["error"], bool(reply["retryable"]))
        if status == "attempt_timeout":  # retried as the task's retry options say
            return runner.record_failure(claim, reply["error"], True)
        if status == "died":
            logger.error("task %s (%s): %s", claim.task_id, claim.task.task_name, reply["error"])
            return runner.record_failure(claim, reply["error"], True)
        if status == "timeout":
            assert claim.deadline_at is not None
            left = self._seconds_to(claim.deadline_at)
            if left > 0:
                time.sleep(left + DEADLINE_MARGIN)
            error = timeout_message(claim.task.max_duration_millis, None)
            return runner.record_failure(claim, f"{error}; {TERMINATED}", False)
        return runner.record_failure(claim, f"cancelled: {TERMINATED}", False)

    # -- children -------------------------------------------------------------------------
    def _spawn(self) -> Child:
        with self._lock:
            return self._spawn_locked()

    def _spawn_locked(self) -> Child:
        assert self.settings_module is not None
        child = Child(self._context, self.settings_module)
        self._children.add(child)
        return child

    def _give_back(self, child: Child) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(child)
                self._freed.notify()
                return
        self._forget(child)
        child.retire()

    def quiet(self) -> None:
        """The worker is stopping: a pool thread still waiting for a child hands its task back
        (not started yet) rather than start it now; running handlers finish."""
        with self._lock:
            self._quiet = True
            self._freed.notify_all()

    def _take(self) -> Child:
        """An idle child, once there is one (ChildDied once the pool is closed or quiet). A
        child missing (its replacement could not be started) is started here."""
        with self._lock:
            if self._quiet:
                raise ChildDied("the worker is stopping")
            while not self._idle and len(self._children) >= self.size:
                if self._closed or self._quiet:
                    raise ChildDied("the worker is stopping")
                self._freed.wait(1.0)
            child = self._idle.pop() if self._idle else None
            dead = None
            if child is not None and not child.alive():  # died idle (the OOM killer, say)
                self._children.discard(child)
                child, dead = None, child
            if child is None:
                child = self._spawn_locked()
            self._served += 1  # in the same step as the child left _idle (free_children)
        if dead is not None:
            dead.stop()
        return child

    def _put(self, child: Child, reusable: bool) -> None:
        """A child back from a task: kept, or replaced when it is done or used up. The
        replacement is started at once (so it is set up when the next task comes), in the
        same step as the old child is let go, so a waiting _take() never starts one too."""
        limit = self.max_tasks_per_child
        if reusable and (limit is None or child.tasks < limit):
            self._give_back(child)
            return
        replacement = None
        with self._lock:
            self._children.discard(child)
            if not self._closed:
                try:
                    replacement = self._spawn_locked()
                except Exception:  # a _take() starts one once a child is missing
                    logger.exception("could not start a child process")
        if reusable:
            child.retire()
        else:
            child.stop()
        if replacement is not None:
            self._give_back(replacement)

    def _forget(self, child: Child) -> None:
        with self._lock:
            self._children.discard(child)

    def ask_stack(self, task_id: str, request_id: str) -> bool:
        """Ask the child running ``task_id``'s handler for its stack (answered through
        ``on_stack``); False when no child here runs it."""
        entry = self.running.get(task_id)
        return entry is not None and entry[0].ask_stack(request_id, task_id)

    def stop_at_steps(self) -> None:
        """The worker stops: every busy child hands its task back at the handler's next
        durable step (SIGUSR1, which its Checkpoints read), as a pool thread does. From a
        signal handler: no lock is taken (a copy of the set is read)."""
        for child in list(self._children):
            pid = child.pid
            # Only a child set up (its handler of SIGUSR1 installed; one still importing
            # would be killed by it) and running a task.
            busy = child.ready and child not in self._idle
            if pid is not None and busy and child.process.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)

    def close(self) -> None:
        """Stop every child: idle ones exit when their pipe closes; one still running a
        handler (a hard stop, or past the shutdown timeout) is terminated."""
        with self._lock:
            self._closed = True
            self._freed.notify_all()
            idle, self._idle = self._idle, []
            busy = self._children - set(idle)
            self._children = set()
        for child in idle:
            child.conn.close()
        for child in busy:  # its pool thread sees it die, and records the attempt
            child.process.terminate()
        for child in [*idle, *busy]:
            child.process.join(GRACE_SECONDS)
            if child.process.is_alive():
                child.process.kill()
                child.process.join()
        # The pool threads record the attempts of the children just stopped: give them a
        # moment, so the worker does not exit first (then the tasks wait for their leases).
        ends = time.monotonic() + RECORD_SECONDS
        with self._lock:
            while self._in_flight and time.monotonic() < ends:
                self._freed.wait(max(0.0, ends - time.monotonic()))
