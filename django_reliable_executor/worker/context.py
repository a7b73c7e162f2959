"""TaskContext: what a handler declared with ``takes_context=True`` is given."""

from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.progress import Progress, make_progress
from ..core.records import TaskInfo
from ..core.states import TaskStatus
from ..core.steps import check_step_name
from ..core.waits import wait_seconds
from .steps import Checkpoints
from .waits import Waiting, check_task_ids, check_timeout, check_wait

if TYPE_CHECKING:
    from ..service.reliable_executor import ReliableExecutor

CANCEL_CHECK_INTERVAL = 1.0  # seconds between storage reads behind context.is_cancelled()

_UNREAD = object()  # context.batch_id not read yet


class TaskContext:
    """Given to handlers declared with ``takes_context=True`` as ``context=``."""

    def __init__(
        self,
        task: TaskInfo,
        deadline_at: dt.datetime | None,
        executor: ReliableExecutor,
        report: Callable[[Progress], object] | None = None,
        checkpoints: Checkpoints | None = None,
        asynchronous: bool | None = None,
    ) -> None:
        self.task = task  # as it started: RUNNING, this attempt counted
        self.task_id = task.task_id
        self.task_name = task.task_name
        self.attempt = task.attempts
        self.resumptions = task.resumptions  # how many times this task was resumed before
        self.deadline_at = deadline_at
        self._executor = executor
        self._token_lock = threading.Lock()
        self._cancelled = False
        self._checked_at = 0.0
        self._on_cancel: Callable[[], object] | None = None
        self._report = report
        self._checkpoints = checkpoints
        # Whether the handler is an async def one (its steps are awaited); None: told by
        # whether this thread runs an event loop when a step is called.
        self._asynchronous = asynchronous
        self._dependency_results: dict[str, Any] | None = None
        self._batch_id: object = task.batch_id or _UNREAD

    @property
    def dependency_results(self) -> dict[str, Any]:
        """Each task id of this task's ``depends_on`` -> the result it returned (None for one
        that ended without a result, or was purged). Read from the storage on first access."""
        if self._dependency_results is None:
            task = self._executor.get_task(self.task_id)
            ids = list(task.depends_on) if task is not None else []
            found = self._executor.storage.get_many(ids) if ids else {}
            self._dependency_results = {d: found[d].result if d in found else None for d in ids}
        return self._dependency_results

    def set_progress(
        self, current: int | float, total: int | float | None = None, message: str = ""
    ) -> None:
        """Report how far the handler got (``TaskInfo.progress``): ``current`` of ``total``
        (None: unknown), with a short ``message``. Cheap: the worker writes the latest report
        at most once a second, off this thread, and the last one before the outcome. Stored
        only while this attempt still holds its lease. TypeError/ValueError naming the
        argument when one does not fit (numbers, not bool, 0 or more, current <= total; a
        message of at most 1000 characters)."""
        progress = make_progress(current, total, message, self._executor.clock.now())
        if self._report is None:
            raise RuntimeError("set_progress: this context belongs to no running task")
        self._report(progress)

    def step(
        self, name: str, fn: Callable[..., Any], *args: Any, atomic: bool = False, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once per task, as the durable step ``name`` (a non-empty
        string, unique within one run of the handler): its result, a JSON value checked as a
        task's result is, is stored under the task as a checkpoint, and a later attempt of the
        task gets the stored value back without calling ``fn``. Returns the result as stored
        (the JSON value: a tuple comes back a list), the same in every attempt. A failing
        ``fn`` stores nothing and its exception goes on as usual.

        The checkpoint is written under this attempt's fencing token and renews its lease
        (on MariaDB and SQLite only once a quarter of it has passed since the last renewal:
        the lease is at least three quarters full after it); when the attempt no longer
        holds the task (its lease was lost: it was recovered, timed out or cancelled),
        nothing is stored and LeaseLostError is raised.

        ``atomic=True`` (database storage only; InvalidTaskOptionError on Redis): ``fn`` runs
        inside ``transaction.atomic(using=<the task database's alias>)`` and the checkpoint is
        written in that transaction, so the ORM writes ``fn`` makes on that alias commit
        exactly when its checkpoint does (a refused checkpoint rolls them back).

        In an ``async def`` handler it returns an awaitable: ``await context.step(name, fn,
        ...)``, ``fn`` an ``async def`` function or a synchronous one (run through
        ``sync_to_async``, off the event loop); an ``async def`` ``fn`` in a synchronous
        handler raises TypeError. DuplicateStepError for a name this run used already;
        TypeError or ValueError for a bad name."""
        check_step_name(name)
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be callable, not {type(fn).__name__}")
        if self._checkpoints is None:
            raise RuntimeError("step: this context belongs to no running task")
        if self._is_async():
            return self._checkpoints.run_async(name, fn, args, kwargs, atomic)
        if inspect.iscoroutinefunction(fn):  # its coroutine would never be awaited
            raise TypeError(
                f"step {name!r}: fn is an async def function: a step of an async def handler, "
                "awaited there (`await context.step(...)`)"
            )
        return self._checkpoints.run(name, fn, args, kwargs, atomic)

    # -- durable waits (docs/durable-tasks.md) ---------------------------------------------
    def sleep(self, name: str, duration: float | dt.timedelta) -> Any:
        """Wait ``duration`` (seconds, or a timedelta) without holding a worker: the handler
        stops here and its task waits PENDING; once the time has passed, whatever restarts
        happen meanwhile, the handler is called again from the top, and this call (the same
        ``name``) returns None at once. The end is fixed by the first call: a resumed one
        never starts the clock again. In an ``async def`` handler: ``await context.sleep``."""
        check_wait(name)
        seconds = wait_seconds(duration, f"sleep {name!r}: duration")
        waiting = self._waiting(name)
        if self._is_async():
            return self._sleep_async(waiting, name, seconds)
        return self._decided(name, lambda: waiting.sleep(name, seconds, waiting.read_sleep(name)))

    async def _sleep_async(self, waiting: Waiting, name: str, seconds: float) -> None:
        from asgiref.sync import sync_to_async

        stored = await self._read(name, sync_to_async(waiting.read_sleep), name)
        return self._decided(name, lambda: waiting.sleep(name, seconds, stored))

    def wait_for_event(self, name: str, timeout: float | dt.timedelta | None = None) -> Any:
        """The payload of event ``name`` sent to this task (``executor.send_event``): at once
        if it was sent already (before this call, or while the task waited), else the handler
        stops here and the task waits PENDING, without a worker, until it is sent (then the
        handler is called again and this call returns its payload) or until ``timeout``
        (seconds or a timedelta, counted from the first call) passes: EventTimeout is raised
        then. In an ``async def`` handler: ``await context.wait_for_event``."""
        check_wait(name)
        seconds = check_timeout(timeout, f"wait_for_event {name!r}: timeout")
        waiting = self._waiting(name)
        if self._is_async():
            return self._event_async(waiting, name, seconds)
        return self._decided(name, lambda: waiting.event(name, seconds, *waiting.read_event(name)))

    async def _event_async(self, waiting: Waiting, name: str, seconds: float | None) -> Any:
        from asgiref.sync import sync_to_async

        stored, events = await self._read(name, sync_to_async(waiting.read_event), name)
        return self._decided(name, lambda: waiting.event(name, seconds, stored, events))

    def wait_for(
        self, name: str, task_ids: Any, timeout: float | dt.timedelta | None = None
    ) -> Any:
        """Every task of ``task_ids`` once all have ended (docs/guarantees.md: terminal, and
        no handler of theirs runs on), as ``{task_id: TaskInfo}``: at once if they have, else
        the handler stops here and the task waits PENDING, without a worker, until the last
        of them ends (then the handler is called again and this call returns them). With a
        ``timeout`` (counted from the first call) passed first, WaitTimeout is raised. A task
        id that names no task raises ValueError. In an ``async def`` handler:
        ``await context.wait_for``."""
        check_wait(name)
        ids = check_task_ids(name, task_ids)
        seconds = check_timeout(timeout, f"wait_for {name!r}: timeout")
        waiting = self._waiting(name)
        if self._is_async():
            return self._tasks_async(waiting, name, ids, seconds)
        return self._decided(
            name, lambda: waiting.tasks(name, ids, seconds, *waiting.read_tasks(ids))
        )

    async def _tasks_async(
        self, waiting: Waiting, name: str, ids: list[str], seconds: float | None
    ) -> Any:
        from asgiref.sync import sync_to_async

        stored, found = await self._read(name, sync_to_async(waiting.read_tasks), ids)
        return self._decided(name, lambda: waiting.tasks(name, ids, seconds, stored, found))

    def _waiting(self, name: str) -> Waiting:
        if self._checkpoints is None:
            raise RuntimeError(f"wait {name!r}: this context belongs to no running task")
        self._checkpoints.enter(name)  # a wait's name is unique in one run, as a step's
        return Waiting(self._checkpoints)

    def _decided(self, name: str, decide: Callable[[], Any]) -> Any:
        """Run a wait's decision; a name whose wait raised an error (not Suspended) may be
        used again in this run (the handler caught it, say)."""
        assert self._checkpoints is not None
        try:
            return decide()
        except Exception:
            self._checkpoints.leave(name, False)
            raise

    async def _read(self, name: str, read: Callable[..., Any], *args: Any) -> Any:
        """An async wait's storage read, off the event loop; an error frees its name."""
        try:
            return await read(*args)
        except Exception:
            assert self._checkpoints is not None
            self._checkpoints.leave(name, False)
            raise

    def _is_async(self) -> bool:
        asynchronous = self._asynchronous
        return asynchronous if asynchronous is not None else _in_event_loop()

    def is_cancelled(self) -> bool:
        """True once a cancel was requested, or the task stopped being this attempt's (it timed
        out or its lease was lost): the handler should stop, its outcome will not count.
        Reads the storage at most once a second."""
        with self._token_lock:
            if self._cancelled:
                return True
            if time.monotonic() - self._checked_at < CANCEL_CHECK_INTERVAL:
                return False
            self._checked_at = time.monotonic()
        task = self._executor.get_task(self.task_id)
        cancelled = (
            task is None
            or task.cancel_requested
            or task.status is not TaskStatus.RUNNING
            or task.attempts != self.attempt
        )
        if cancelled:
            self.mark_cancelled()
        return cancelled

    def mark_cancelled(self) -> None:
        with self._token_lock:
            first = not self._cancelled
            self._cancelled = True
            on_cancel = self._on_cancel
        if first and on_cancel is not None:
            on_cancel()

    def on_cancel(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (from whichever thread marks it) once this attempt should stop;
        at once if it already should. The event loop cancels an async handler's coroutine so."""
        with self._token_lock:
            self._on_cancel = callback
            cancelled = self._cancelled
        if cancelled:
            callback()

    @property
    def batch_id(self) -> str | None:
        """The batch (executor.submit_batch) this task is a member or a callback of, or None.
        Read from the storage on first use (a claim does not carry it), then kept."""
        if self._batch_id is _UNREAD:
            task = self._executor.get_task(self.task_id)
            self._batch_id = task.batch_id if task is not None else None
        return self._batch_id  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"<TaskContext {self.task_id} attempt={self.attempt}>"


def _in_event_loop() -> bool:
    """This thread runs an event loop (an async def handler calls): a step must not block it."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
