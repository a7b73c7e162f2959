"""Coalesces handlers' progress reports: at most one write per task a second, off their thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from ..core.progress import WRITE_INTERVAL_SECONDS
from ..exceptions import storage_unavailable

logger = logging.getLogger("django_reliable_executor")

T = TypeVar("T")
# The thread exits after this long with no task to watch (started again by the next report).
IDLE_SECONDS = 30.0


class ProgressWriter(Generic[T]):
    """Keeps the latest report of each task (``put``: no I/O, so a handler may call it in a
    tight loop) and hands them to ``write`` in batches on a thread of its own, each task's at
    most once per ``interval`` seconds: a report within the interval waits for its end, and a
    later one replaces it. ``finish(task_id)`` writes a task's waiting report at once, on the
    caller's thread, and forgets the task: called before its outcome is recorded, so the
    last report is never lost to a write refused after the task ended.

    The worker writes to the storage through it; a process pool's child sends over its pipe."""

    def __init__(
        self,
        write: Callable[[list[T]], object],
        *,
        interval: float = WRITE_INTERVAL_SECONDS,
        name: str = "reliable-executor-progress",
        on_exit: Callable[[], object] | None = None,
    ) -> None:
        self._write = write
        self._on_exit = on_exit  # run on the thread as it ends (closes its connections)
        self._closed = False
        self.interval = interval
        self._name = name
        self._changed = threading.Condition()
        # Held through a write: finish() waits for a batch in flight that may hold its task's
        # report, so reports reach the storage in order, and none after the outcome.
        self._writing = threading.Lock()
        self._waiting: dict[str, T] = {}
        self._written_at: dict[str, float] = {}  # monotonic time of each task's last write
        self._in_flight: set[str] = set()  # tasks whose report the thread is writing now
        self._thread: threading.Thread | None = None

    def put(self, task_id: str, report: T) -> None:
        with self._changed:
            replaced = task_id in self._waiting
            self._waiting[task_id] = report
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif not replaced:  # a report replaced is due when it was: the thread knows when
                self._changed.notify()

    def pending(self, task_id: str) -> bool:
        """A report of the task waits to be written, or is being written now: ``finish``
        has to write or wait. Otherwise ``forget`` will do, which never waits."""
        with self._changed:
            return task_id in self._waiting or task_id in self._in_flight

    def forget(self, task_id: str) -> None:
        """Forget a task that has nothing pending (see ``pending``)."""
        with self._changed:
            self._written_at.pop(task_id, None)
            self._changed.notify()  # the thread may have nothing left to watch

    def finish(self, task_id: str) -> None:
        """Write the task's waiting report now (never raises: a failure is logged) and forget
        the task. Waits only when a report of the task is pending (see ``pending``)."""
        # Without the lock, for the tasks that never reported (most): the thread marks a task
        # written before it takes its report from _waiting, so one of the two always shows it.
        if task_id not in self._waiting and task_id not in self._written_at:
            return
        if not self.pending(task_id):
            self.forget(task_id)
            return
        with self._writing:
            with self._changed:
                report = self._waiting.pop(task_id, None)
                self._written_at.pop(task_id, None)
            if report is not None:
                self._write_logged([report])

    def _due(self, now: float) -> tuple[list[str], float | None]:
        """The tasks whose report may be written now, and how long until the next one may."""
        due: list[str] = []
        wait: float | None = None
        for task_id in self._waiting:
            left = self._written_at.get(task_id, -self.interval) + self.interval - now
            if left <= 0:
                due.append(task_id)
            elif wait is None or left < wait:
                wait = left
        return due, wait

    def close(self) -> None:
        """Stop the thread (reports still waiting are dropped: ``finish`` each task first)."""
        with self._changed:
            self._closed = True
            thread, self._thread = self._thread, None
            self._changed.notify()
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        try:
            while self._next():
                pass
        finally:
            if self._on_exit is not None:
                self._on_exit()

    def _next(self) -> bool:
        """Wait for due reports and write them; False once the thread should end."""
        with self._changed:
            if self._closed:
                return False
            due, wait = self._due(time.monotonic())
            if not due:
                if wait is None and not self._written_at:  # no task to watch
                    if not self._changed.wait(IDLE_SECONDS) and not self._waiting:
                        self._thread = None  # a later put() starts another
                        return False
                    return True
                self._changed.wait(wait)
                return True
        with self._writing:
            with self._changed:
                now = time.monotonic()
                due, _ = self._due(now)
                for task_id in due:  # before the reports leave _waiting: see finish()
                    self._written_at[task_id] = now
                self._in_flight.update(due)
                batch = [self._waiting.pop(task_id) for task_id in due]
            if batch:
                self._write_logged(batch)
            with self._changed:
                self._in_flight.clear()
        return True

    def _write_logged(self, batch: list[T]) -> None:
        """Write ``batch`` (never raises). Progress is advisory: a write that fails is logged,
        never the task's failure. A batch refused (rather than out of reach) is written again
        report by report, as the completion writer does: one report the storage cannot take
        never drops the others'."""
        try:
            self._write(batch)
            return
        except Exception as exc:
            if len(batch) == 1 or storage_unavailable(exc):
                logger.warning(
                    "could not write the progress of %d tasks", len(batch), exc_info=True
                )
                return
            logger.warning(
                "the storage refused the progress of %d tasks (%s); writing them one by one",
                len(batch),
                exc,
            )
        for report in batch:
            try:
                self._write([report])
            except Exception as exc:
                logger.warning("could not write a progress report", exc_info=True)
                if storage_unavailable(exc):
                    return
