"""The stack responder: answers requests for the live stacks of the handlers running here.

The heartbeat thread calls ``serve`` between its beats. While this worker runs no task it only
waits (no I/O: a request is made only for a running task). While it runs tasks it takes its
requests from the storage (Redis: blocked on its request list, so a request arrives at once;
the databases: one indexed poll per POLL_SECONDS) and answers each: from a thread, the frames
of the pool thread running the handler (``TaskRunner.running_threads``); under ``--pool
process``, the child running it formats its own main thread's frames and sends them back over
the pipe, and the pool thread waiting on that child stores the answer (``answer_from_child``);
an async handler's coroutine frames are read on the event loop's thread (``_answer_on_loop``).
Nothing here can hold up lease renewal: ``serve`` returns within its timeout (and at most
LOOP_WAIT_SECONDS more while it waits for the event loop), and its errors are logged and
dropped.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from ..connections import drop_unusable_connections
from ..core.records import Claim
from ..core.stacks import POLL_SECONDS, StackAnswer, StackRequest, format_stack
from ..registry import get_handler
from .attempt_limits import attempt_timeout_of
from .loop_stacks import LOOP_WAIT_SECONDS

if TYPE_CHECKING:
    from ..service.reliable_executor import ReliableExecutor
    from .event_loop import EventLoop
    from .pool import BoundedPool
    from .process_pool import ProcessPool
    from .runner import TaskRunner

logger = logging.getLogger("django_reliable_executor")

NOT_HERE = "not running on this worker any more (it has just ended)"
#: Where an async handler's stack was read: its coroutine's own frames, each coroutine it
#: awaits down to the innermost ``await`` (core.stacks.format_coroutine_stack).
ON_EVENT_LOOP = "coroutine on the event loop (thread {thread} of process {pid})"
#: Where, when the event loop did not get to reading the coroutines within LOOP_WAIT_SECONDS:
#: the loop thread's frames, which show what blocks it.
LOOP_BLOCKED = (
    "the event loop's thread {thread} of process {pid}, blocked: it did not read the coroutine "
    "within {wait:g} s, and its frames show what blocks it (this handler, or another on the loop)"
)


class StackResponder:
    """Answers the stack requests made for ``worker_id`` (see the module docstring)."""

    def __init__(
        self,
        executor: ReliableExecutor,
        worker_id: str,
        runner: TaskRunner,
        pool: BoundedPool,
        processes: ProcessPool | None,
        done: threading.Event,
        event_loop: EventLoop | None = None,
    ) -> None:
        self.executor = executor
        self.event_loop = event_loop
        self.worker_id = worker_id
        self.runner = runner
        self.pool = pool
        self.processes = processes
        self.done = done
        self._failing = False
        if processes is not None:
            processes.on_stack = self.answer_from_child

    def serve(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds (at most POLL_SECONDS), answering the requests that
        come meanwhile; returns early once ``done`` is set or a blocking take returned."""
        timeout = max(0.0, min(timeout, POLL_SECONDS))
        if not self.pool.running_ids():
            self.done.wait(timeout)
            return
        storage = self.executor.storage
        blocking = storage.blocking_stack_wait
        began = time.monotonic()
        try:
            requests = storage.take_stack_requests(self.worker_id, timeout if blocking else 0)
            on_loop = [request for request in requests if not self._answer(request)]
            if on_loop:
                self._answer_on_loop(on_loop)
        except Exception:
            if not self._failing:
                logger.exception("worker %s: could not answer stack requests", self.worker_id)
            self._failing = True
            drop_unusable_connections()
            blocking = False  # wait out the rest below rather than try again at once
        else:
            if self._failing:
                logger.info("worker %s: answering stack requests again", self.worker_id)
            self._failing = False
        if not blocking:
            self.done.wait(max(0.0, timeout - (time.monotonic() - began)))

    def _answer(self, request: StackRequest) -> bool:
        """Answer ``request``, or leave it to ``_answer_on_loop`` (False): its handler is a
        coroutine on the event loop."""
        task_id = request.task_id
        if self.processes is not None and self.processes.ask_stack(task_id, request.request_id):
            return True  # the child answers; its pool thread stores it (answer_from_child)
        entry = self.runner.running_threads.get(task_id)
        if entry is not None:
            ident, claim = entry
            stack, truncated = format_stack(sys._current_frames().get(ident))
            where = f"thread {_thread_name(ident)} of process {os.getpid()}"
            self._store(request.request_id, claim, True, stack, truncated, where=where)
        elif task_id in self.pool.async_running_ids() and self.event_loop is not None:
            return False
        else:
            self._store_not_running(request.request_id, task_id, NOT_HERE)
        return True

    def _answer_on_loop(self, requests: list[StackRequest]) -> None:
        """Answer the requests for handlers on the event loop with their coroutines' frames,
        read on the loop's thread (one wait of at most LOOP_WAIT_SECONDS for them all); when
        the loop does not get to it, with its thread's frames, which show what blocks it."""
        loop = self.event_loop
        assert loop is not None
        stacks = loop.coroutine_stacks([r.task_id for r in requests], LOOP_WAIT_SECONDS)
        ident = loop.loop_thread_ident()
        thread, pid = _thread_name(ident), os.getpid()
        blocked = None
        if stacks is None:
            blocked = format_stack(sys._current_frames().get(ident) if ident else None)
        for request in requests:
            claim = loop.started_claim(request.task_id)
            found = blocked if blocked is not None else (stacks or {}).get(request.task_id)
            if claim is None or found is None:  # ended meanwhile
                self._store_not_running(request.request_id, request.task_id, NOT_HERE)
                continue
            if blocked is not None:
                where = LOOP_BLOCKED.format(thread=thread, pid=pid, wait=LOOP_WAIT_SECONDS)
            else:
                where = ON_EVENT_LOOP.format(thread=thread, pid=pid)
            self._store(request.request_id, claim, True, *found, where=where)

    def answer_from_child(self, claim: Claim, reply: dict[str, Any]) -> None:
        """A child's reply to a stack request (from the pool thread waiting on that child)."""
        try:
            running = bool(reply.get("running")) and reply.get("task_id") == claim.task_id
            pid = reply.get("pid")
            self._store(
                str(reply["request_id"]),
                claim,
                running,
                str(reply.get("stack", "")),
                bool(reply.get("truncated")),
                where=f"child process {pid}",
                pid=pid,
                rss_bytes=reply.get("rss_bytes"),
                task_id=str(reply.get("task_id", claim.task_id)),
            )
        except Exception:
            logger.exception("worker %s: could not store a child's stack", self.worker_id)
            drop_unusable_connections()

    def _store(
        self,
        request_id: str,
        claim: Claim,
        running: bool,
        stack: str,
        truncated: bool,
        *,
        where: str,
        pid: int | None = None,
        rss_bytes: int | None = None,
        task_id: str | None = None,
    ) -> None:
        if not running:  # ended meanwhile: the claim's facts are not this request's
            self._store_not_running(request_id, task_id or claim.task_id, NOT_HERE)
            return
        task = claim.task
        now = self.executor.clock.now()
        started = task.started_at
        self.executor.storage.answer_stack(
            StackAnswer(
                request_id=request_id,
                task_id=task_id or task.task_id,
                worker_id=self.worker_id,
                answered_at=now,
                running=running,
                stack=stack,
                truncated=truncated,
                elapsed_seconds=(now - started).total_seconds() if started else None,
                deadline_at=claim.deadline_at,
                attempt_timeout=attempt_timeout_of(task, get_handler(task.task_name)),
                pid=pid if pid is not None else os.getpid(),
                rss_bytes=rss_bytes,
                where=where,
            )
        )

    def _store_not_running(self, request_id: str, task_id: str, why: str) -> None:
        """An answer without frames: the handler is not here (any more)."""
        self.executor.storage.answer_stack(
            StackAnswer(
                request_id=request_id,
                task_id=task_id,
                worker_id=self.worker_id,
                answered_at=self.executor.clock.now(),
                running=False,
                pid=os.getpid(),
                where=why,
            )
        )


def _thread_name(ident: int | None) -> str:
    """The name of the thread ``ident`` (its ident when it has ended)."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return names.get(ident, str(ident))
