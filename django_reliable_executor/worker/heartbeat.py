"""The heartbeat: renews the leases of the claims held here and keeps this worker registered."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence

from django.db import close_old_connections

from ..connections import drop_unusable_connections
from ..master.chores import MasterChores
from ..service.reliable_executor import ReliableExecutor
from .pool import BoundedPool
from .runner import TaskRunner

logger = logging.getLogger("django_reliable_executor")


class Heartbeat:
    """One worker's heartbeat. ``beat()`` renews every lease held here (queued, running or
    awaiting its recorded completion), then refreshes the worker registry; ``run()`` beats every
    ``interval`` seconds until ``done`` is set, and between beats answers the requests for
    live stacks (``serve_stacks``). Lease writes tell the chores whether the storage was
    reached, so they can hold recovery back after an outage."""

    def __init__(
        self,
        executor: ReliableExecutor,
        pool: BoundedPool,
        runner: TaskRunner,
        chores: MasterChores,
        done: threading.Event,
        *,
        worker_id: str,
        queues: Sequence[str],
        lease_timeout: float,
        interval: float,
        supervised: Sequence[Callable[[], str | None]] = (),
        serve_stacks: Callable[[float], None] | None = None,
    ) -> None:
        self.executor = executor
        self.pool = pool
        self.runner = runner
        self.chores = chores
        self.done = done
        self.worker_id = worker_id
        self.queues = queues
        self.lease_timeout = lease_timeout
        self.interval = interval
        self._registry_failing = False
        # Each checks a part of the worker (the pool's threads, the event loop's), fails what
        # a dead one held and starts it again: None when all is well then, else what is wrong
        # (or it raises: it could not start it again). While one is wrong the worker stops
        # registering, so that health reports it (its heartbeat ages past --max-age).
        self.supervised = list(supervised)
        self._unwell = False
        # Between beats: waits up to the given seconds (at most about one), answering the stack
        # requests that come meanwhile (stacks.StackResponder.serve).
        self.serve_stacks = serve_stacks

    def run(self) -> None:
        """Beat every ``interval`` seconds until ``done`` is set (the heartbeat thread)."""
        previous = time.monotonic()
        while not self._wait(time.monotonic() + self.interval):
            now = time.monotonic()
            self._warn_if_late(now - previous)
            previous = now
            self.beat()
        close_old_connections()

    def _wait(self, until: float) -> bool:
        """Wait until ``until`` (time.monotonic()) or ``done``, answering stack requests
        meanwhile; True once ``done`` is set."""
        if self.serve_stacks is None:
            return self.done.wait(max(0.0, until - time.monotonic()))
        while not self.done.is_set() and (left := until - time.monotonic()) > 0:
            try:
                self.serve_stacks(left)
            except Exception:  # never at the cost of the leases: wait out this round instead
                logger.exception("worker %s: answering stack requests failed", self.worker_id)
                return self.done.wait(max(0.0, until - time.monotonic()))
        return self.done.is_set()

    def _warn_if_late(self, gap: float) -> None:
        """A round later than LEASE_TIMEOUT / 2 after the previous one puts the leases held here
        at risk: say so, with the usual causes (a thread pool cannot preempt a handler that
        holds the GIL; the process pool runs handlers outside this process)."""
        limit = self.lease_timeout / 2
        if gap > limit:
            logger.warning(
                "heartbeat came %.2fs after the previous one, more than LEASE_TIMEOUT / 2 = "
                "%.2fs: leases not renewed within LEASE_TIMEOUT (%.2fs) are recovered and their "
                "tasks run again. A handler holding the GIL (one long call into C code), an "
                "overloaded machine or a paused process delays the heartbeat thread "
                "(runexecutor --pool process runs handlers in child processes instead)",
                gap,
                limit,
                self.lease_timeout,
            )

    def beat(self) -> None:
        """Renew the leases of every claim held here, then refresh this worker's row in the
        worker registry: separate writes, so that no other write can keep leases from renewal."""
        self._renew_leases()
        if self._supervise():
            self._register()

    def _supervise(self) -> bool:
        """Check the supervised parts; False while one is wrong (dead and not started again,
        or stalled), said once until it is right again."""
        problems = []
        for check in self.supervised:
            try:
                problem = check()
            except Exception as exc:
                logger.exception("worker %s: could not start a dead part again", self.worker_id)
                problem = f"a dead part could not be started again: {exc}"
            if problem is not None:
                problems.append(problem)
        if problems and not self._unwell:
            logger.error(
                "worker %s: %s; not registering until it is right, so that `executor health` "
                "reports this worker (its leases are still renewed)",
                self.worker_id,
                "; ".join(problems),
            )
        elif self._unwell and not problems:
            logger.info("worker %s: its parts are running again; registering", self.worker_id)
        self._unwell = bool(problems)
        return not problems

    def _register(self) -> None:
        try:
            self.executor.storage.worker_seen(
                self.worker_id,
                {
                    "hostname": socket.gethostname(),
                    "pid": os.getpid(),
                    "queues": list(self.queues),
                },
            )
        except Exception:
            if not self._registry_failing:
                logger.exception("worker %s: could not write the worker registry", self.worker_id)
            self._registry_failing = True
            drop_unusable_connections()
            return
        if self._registry_failing:
            logger.info("worker %s recorded in the worker registry again", self.worker_id)
        self._registry_failing = False

    def _renew_leases(self) -> None:
        """Renew the leases of every claim held here; stop tracking any that were lost."""
        storage = self.executor.storage
        claims = self.pool.held()
        if self.runner.writer is not None:
            claims += self.runner.writer.held()
        if not claims:
            return
        for first_try in (True, False):
            try:
                held = storage.heartbeat(
                    self.worker_id,
                    {c.task_id: c.token for c in claims},
                    self.lease_timeout,
                )
                break
            except Exception:
                # A connection the server killed fails once: renew again at once on a new one.
                if first_try and drop_unusable_connections():
                    continue
                logger.exception("heartbeat: renewing %d leases failed", len(claims))
                self.chores.storage_failed()
                drop_unusable_connections()
                return
        self.chores.storage_reached()
        # The token moves only when the task is claimed again, so a different one means lost.
        lost = {c.task_id for c in claims if held.get(c.task_id, (None,))[0] != c.token}
        dropped = self.pool.drop(lost)
        for claim in dropped:
            logger.info("task %s: lease lost before it started; dropped", claim.task_id)
        for task_id, (_, cancel_requested) in held.items():
            context = self.runner.contexts.get(task_id)
            if context is not None and cancel_requested:
                context.mark_cancelled()
        for task_id in lost:
            context = self.runner.contexts.get(task_id)
            if context is not None:
                context.mark_cancelled()
