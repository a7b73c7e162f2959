"""Durable steps: what ``context.step`` does for one attempt of a task (docs/durable-tasks.md).

A step runs its function once per task: its result is stored under the task as a checkpoint
(``storage.record_step``, fenced by the attempt's claim, renewing its lease once a quarter of
it has passed), and a later
attempt of the task gets the stored result back without calling the function. The checkpoints
stored before the attempt are read at its first step (one read), then kept with the ones it
writes."""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..connections import with_reconnect
from ..core.clock import Clock
from ..core.records import Claim
from ..core.serialization import RESULT_REFUSED, ConversionError, Encoded, encode
from ..core.waits import RECORD_KEY
from ..exceptions import DuplicateStepError, InvalidTaskOptionError, LeaseLostError
from .suspended import Suspended

if TYPE_CHECKING:
    from ..service.reliable_executor import ReliableExecutor
    from ..storage.base import TaskStorage


class Checkpoints:
    """One attempt's durable steps: the checkpoints its task holds, the names its handler used
    so far (a name used twice in one run is refused), and the fenced writes of new ones."""

    def __init__(
        self,
        claim: Claim,
        executor: ReliableExecutor,
        lease_seconds: float,
        stopping: Callable[[], bool] | None = None,
        on_step: Callable[[str], object] | None = None,
    ) -> None:
        self.claim = claim  # as started: RUNNING, its token fences every checkpoint
        self._executor = executor
        self.lease_seconds = lease_seconds
        # The worker is stopping (SIGTERM): a step not stored yet hands the task back instead
        # of running (Suspended(None)), to be resumed by another worker at that step.
        self._stopping = stopping
        # A process pool's child: tells its worker of each checkpoint (the worker counts it
        # in the metrics it exports).
        self._on_step = on_step
        self._lock = threading.Lock()
        self._stored: dict[str, Any] | None = None  # read at the first step
        self._used: set[str] = set()  # steps that returned a value in this run, or run now
        # When this attempt last renewed its lease, as far as it knows (its start; the
        # heartbeat's renewals are not counted, so this is never later than the truth).
        started = claim.task.started_at
        self._renewed_at: dt.datetime | None = (
            None if started is None else min(started, executor.clock.now())
        )

    @property
    def storage(self) -> TaskStorage:
        return self._executor.storage

    @property
    def clock(self) -> Clock:
        return self._executor.clock

    # -- the handler's thread -------------------------------------------------------------
    def run(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        atomic: bool,
    ) -> Any:
        """``context.step`` in a thread: the stored result, or ``fn``'s, stored now."""
        alias = self._alias(name) if atomic else None
        self.enter(name)
        done = False
        try:
            stored = self.results()
            if name in stored:
                _not_a_wait(name, stored[name])
                done = True
                return stored[name]
            self._stop_here()
            if alias is not None:
                value = self._run_atomic(alias, name, fn, args, kwargs)
            else:
                encoded = _encode(name, fn(*args, **kwargs))
                self._write(name, encoded)
                value = encoded.value
            done = True
            return value
        finally:
            self.leave(name, done)

    async def run_async(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        atomic: bool,
    ) -> Any:
        """``await context.step`` in an async handler: as ``run``, the storage's calls (and a
        synchronous ``fn``) made through ``sync_to_async``, off the event loop, in the thread
        Django gives thread-sensitive calls (where the handler's own ORM calls run)."""
        from asgiref.sync import sync_to_async

        alias = self._alias(name) if atomic else None
        if alias is not None and inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"step {name!r}: atomic=True takes a synchronous function (a Django transaction "
                "cannot span an await); it runs in the thread of the handler's ORM calls"
            )
        self.enter(name)
        done = False
        try:
            stored = await sync_to_async(self.results)()
            if name in stored:
                _not_a_wait(name, stored[name])
                done = True
                return stored[name]
            self._stop_here()
            if alias is not None:
                value = await sync_to_async(self._run_atomic)(alias, name, fn, args, kwargs)
            else:
                if inspect.iscoroutinefunction(fn):
                    result = await fn(*args, **kwargs)
                else:
                    result = await sync_to_async(fn)(*args, **kwargs)
                    if inspect.isawaitable(result):  # a partial of an async function, say
                        result = await result
                encoded = _encode(name, result)
                await sync_to_async(self._write)(name, encoded)
                value = encoded.value
            done = True
            return value
        finally:
            self.leave(name, done)

    # -- helpers --------------------------------------------------------------------------
    def _stop_here(self) -> None:
        """A step about to run while the worker stops: the handler stops here instead, and its
        task is handed back to be resumed (by another worker) from this step."""
        if self._stopping is not None and self._stopping():
            raise Suspended(None)

    def _alias(self, name: str) -> str:
        """The database alias an atomic step's transaction uses; refused where the storage
        keeps its tasks outside Django's databases (Redis)."""
        alias = self.storage.transaction_alias
        if alias is None:
            raise InvalidTaskOptionError(
                f"step {name!r}: atomic=True needs the database storage: there the checkpoint "
                "is written in the transaction of the step's ORM writes; the Redis storage's "
                "checkpoint cannot join a database transaction, so it would not commit exactly "
                "with them",
                field="atomic",
            )
        return alias

    def enter(self, name: str) -> None:
        with self._lock:
            if name in self._used:
                raise DuplicateStepError(self.claim.task_id, name)
            self._used.add(name)

    def leave(self, name: str, done: bool) -> None:
        """A step that raised may run again in this run (the handler caught it, say)."""
        if not done:
            with self._lock:
                self._used.discard(name)

    def results(self) -> dict[str, Any]:
        """The checkpoints of the task: read once, at the attempt's first step."""
        if self._stored is None:
            stored = with_reconnect(lambda: self.storage.step_results(self.claim.task_id))
            with self._lock:
                if self._stored is None:
                    self._stored = stored
        return self._stored

    def _write(self, name: str, encoded: Encoded) -> None:
        """Store the checkpoint under the claim's token (renewing its lease); LeaseLostError
        when the claim no longer holds the task."""
        if not with_reconnect(functools.partial(self._record, name, encoded)):
            raise LeaseLostError(self.claim.task_id, f"the checkpoint of step {name!r}")
        self._keep(name, encoded.value)
        self._announce(name)

    def _record(self, name: str, encoded: Encoded) -> bool:
        """``storage.record_step``, asked to renew the lease only once a quarter of it has
        passed since this attempt last renewed it. Why: on MariaDB and SQLite the renewal is a
        statement of its own (a round trip per step); a lease renewed less than a quarter of
        it ago is still three quarters full, as the heartbeat keeps it (LEASE_TIMEOUT / 4)."""
        now = self.clock.now()
        quarter = dt.timedelta(seconds=self.lease_seconds / 4)
        with self._lock:
            renew = self._renewed_at is None or now - self._renewed_at >= quarter
        stored = self.storage.record_step(
            self.claim, name, encoded, self.lease_seconds, renew_lease=renew
        )
        if stored and renew:
            self._renewed(now)  # the storage's own now, which set the lease, is later
        return stored

    def _renewed(self, now: dt.datetime) -> None:
        """The lease was renewed at ``now``: counted at once, or, inside a transaction open on
        the task database (an atomic step, or the handler's own), once it commits (a renewal
        rolled back with it does not count)."""
        alias = self.storage.transaction_alias
        if alias is not None:
            from django.db import transaction

            if transaction.get_connection(alias).in_atomic_block:
                transaction.on_commit(functools.partial(self._renewed, now), using=alias)
                return
        with self._lock:
            if self._renewed_at is None or now > self._renewed_at:
                self._renewed_at = now

    def _run_atomic(
        self,
        alias: str,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """``fn`` and its checkpoint in one transaction on ``alias``: a refused checkpoint
        (LeaseLostError) or an error rolls ``fn``'s writes back with it."""
        from django.db import transaction

        with transaction.atomic(using=alias):
            encoded = _encode(name, fn(*args, **kwargs))
            if not self._record(name, encoded):
                raise LeaseLostError(self.claim.task_id, f"the checkpoint of step {name!r}")
            # Inside a transaction of the handler's own, the checkpoint commits with it (or
            # never): announced then.
            transaction.on_commit(functools.partial(self._announce, name), using=alias)
        self._keep(name, encoded.value)
        return encoded.value

    def _announce(self, name: str) -> None:
        """The checkpoint of ``name`` is stored: ``task_step_finished`` and the steps counter."""
        self._executor.announcer.step_finished(self.claim.task, name)
        if self._on_step is not None:
            self._on_step(name)

    def _keep(self, name: str, value: Any) -> None:
        with self._lock:
            if self._stored is not None:
                self._stored[name] = value


def _not_a_wait(name: str, stored: Any) -> None:
    """A step may not take the name of a durable wait stored (its record is no result)."""
    if isinstance(stored, dict) and RECORD_KEY in stored:
        raise TypeError(
            f"step {name!r}: the task stored a wait of that name; each step and wait needs "
            "a name of its own"
        )


def _encode(name: str, value: Any) -> Encoded:
    """A step's result as stored: checked as a task's result is, refused with its words."""
    if inspect.isawaitable(value):
        _close(value)
        raise TypeError(
            f"step {name!r}: its function returned an awaitable, not a value; an async "
            "function is a step of an async def handler: `await context.step(...)`"
        )
    try:
        return encode(value)
    except ConversionError as exc:
        raise ConversionError(f"step {name!r}: {RESULT_REFUSED}: {exc}") from None
    except Exception as exc:  # a model_dump() that raises, say
        raise ConversionError(
            f"step {name!r}: {RESULT_REFUSED}: {type(exc).__name__}: {exc}"
        ) from exc


def _close(awaitable: Awaitable[Any]) -> None:
    """Close a coroutine never awaited (no "never awaited" warning)."""
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()
