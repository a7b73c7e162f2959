"""Per-attempt time limits (``attempt_timeout``) of handlers run in threads: one timer thread
per worker calls an attempt's expiry at its limit, unless the attempt finished first.

The expiry only tells the handler to stop (its TaskContext is marked cancelled): a thread
cannot be stopped from outside, so the attempt keeps its claim, its lease and its slot until
the handler returns, and only then is it recorded as failed. The event loop uses its own
timers (``loop.call_later``) and the process pool its own wait; neither needs this thread.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..core.records import Claim, TaskInfo
from ..registry import TaskHandler

logger = logging.getLogger("django_reliable_executor")

ARMED, EXPIRED, FINISHED = "armed", "expired", "finished"
# Entries of finished attempts stay in the heap until they come up or the heap is compacted:
# compacted once it holds more than this many and over half of them are finished.
COMPACT_AT = 64


class AttemptLimit:
    """One attempt's limit: ``seconds`` from when it was armed, due at ``due`` (monotonic)."""

    __slots__ = ("due", "on_expiry", "seconds", "state")

    def __init__(self, due: float, seconds: float, on_expiry: Callable[[], object]) -> None:
        self.due = due
        self.seconds = seconds
        self.on_expiry = on_expiry
        self.state = ARMED


class AttemptTimer:
    """Arms limits and calls each one's ``on_expiry`` at its due time, from a daemon thread
    started with the first limit. Thread-safe. Whether an attempt timed out is decided once,
    under the lock: by the timer (expired) or by ``finish`` (finished in time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, AttemptLimit]] = []
        self._armed = 0
        self._order = itertools.count()  # ties of due times: first armed, first expired
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, on_expiry: Callable[[], object]) -> AttemptLimit:
        """A limit due ``seconds`` from now; ``on_expiry`` is called (from the timer's thread,
        once) if the attempt has not finished by then."""
        limit = AttemptLimit(time.monotonic() + seconds, seconds, on_expiry)
        with self._lock:
            heapq.heappush(self._heap, (limit.due, next(self._order), limit))
            self._armed += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="reliable-executor-attempt-timer", daemon=True
                )
                self._thread.start()
            elif self._heap[0][2] is limit:  # due before the one the thread waits for
                self._changed.notify()
        return limit

    def finish(self, limit: AttemptLimit) -> bool:
        """The attempt's handler returned or raised: True when its limit had passed first (its
        expiry was called, or is being called), False when it finished in time (its expiry is
        then never called). Asking again gives the same answer."""
        with self._lock:
            if limit.state == ARMED:
                limit.state = FINISHED
                self._armed -= 1
                if len(self._heap) > COMPACT_AT and len(self._heap) > 2 * self._armed:
                    self._heap = [entry for entry in self._heap if entry[2].state == ARMED]
                    heapq.heapify(self._heap)
                return False
            return limit.state == EXPIRED

    def armed(self) -> int:
        """Limits armed and not yet expired or finished."""
        with self._lock:
            return self._armed

    def _run(self) -> None:
        while True:
            for limit in self._next_expired():
                try:
                    limit.on_expiry()
                except Exception:
                    logger.exception("an attempt's time limit: its expiry failed")

    def _next_expired(self) -> list[AttemptLimit]:
        """Wait until limits are due; mark them expired and return them."""
        with self._lock:
            while True:
                heap = self._heap
                while heap and heap[0][2].state != ARMED:
                    heapq.heappop(heap)
                now = time.monotonic()
                due: list[AttemptLimit] = []
                while heap and heap[0][0] <= now:
                    limit = heapq.heappop(heap)[2]
                    if limit.state == ARMED:
                        limit.state = EXPIRED
                        self._armed -= 1
                        due.append(limit)
                if due:
                    return due
                self._changed.wait(heap[0][0] - now if heap else None)


def attempt_timeout_of(task: TaskInfo, handler: TaskHandler[Any] | None) -> float | None:
    """Seconds an attempt of ``task`` may run: its own attempt_timeout, else its handler's
    (a task stored without one: a schedule's run, a submit from a process without the
    handler), else None (no limit)."""
    if task.attempt_timeout is not None:
        return task.attempt_timeout
    return handler.attempt_timeout if handler is not None else None


def log_attempt_expired(claim: Claim, seconds: float, doing: str) -> None:
    """The line a worker logs when an attempt passes its attempt_timeout, saying what it does
    about it (``doing``)."""
    logger.warning(
        "task %s (%s): attempt %s ran past its attempt_timeout of %g s; %s. It counts as a "
        "failed attempt once its handler has ended, and does not run again before then",
        claim.task_id,
        claim.task.task_name,
        claim.task.attempts,
        seconds,
        doing,
    )


class _Stoppable(Protocol):
    """A TaskContext, as far as ``ask_to_stop`` uses it."""

    def mark_cancelled(self) -> None: ...


def ask_to_stop(claim: Claim, seconds: float, context: _Stoppable | None) -> None:
    """The timer's call at a thread's attempt's limit: tell the handler to stop. The claim
    stays held (lease renewed, slot taken) until the handler returns."""
    log_attempt_expired(
        claim,
        seconds,
        "asking its handler to stop (context.is_cancelled() is True now)"
        if context is not None
        else "its handler takes no context, so it cannot be asked to stop",
    )
    if context is not None:
        context.mark_cancelled()
