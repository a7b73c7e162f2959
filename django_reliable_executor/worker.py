"""The runexecutor worker: claim loop, bounded pool, heartbeat and scheduler threads, and the
phased shutdown (quiet -> hand back unstarted claims -> drain -> stop)."""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence

from django.db import DatabaseError, close_old_connections

from . import metrics, registry
from .connections import drop_unusable_connections
from .exceptions import ReliableExecutorError, StorageUnavailableError
from .execution import TaskRunner
from .leadership import MasterLock
from .pool import BoundedPool
from .records import Claim
from .scheduler import Scheduler
from .service import ReliableExecutor
from .service import executor as default_executor

logger = logging.getLogger("django_reliable_executor")

CLAIM_BATCH = 100  # most claims taken in one round trip
MIN_IDLE_WAIT = 0.005  # first wait after the queue ran dry; doubles up to POLL_INTERVAL
BURST_HORIZON_SECONDS = 60.0
MAX_ERROR_WAIT = 5.0  # longest pause between claims while the storage is unreachable


def default_worker_id() -> str:
    """hostname-pid-random: unique even when a pid is reused after a restart."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclasses.dataclass
class WorkerOptions:
    queues: Sequence[str] = ("default",)
    # Most claims of a queue held (running or waiting in the local queue) at once; a queue
    # absent here has no limit of its own.
    queue_limits: dict[str, int] = dataclasses.field(default_factory=dict)
    core_pool_size: int = 5
    max_pool_size: int = 10
    queue_capacity: int = 100
    poll_interval: float = 1.0
    lease_timeout: float = 60.0
    master_lock_ttl: float = 10.0
    finished_retention: float = 7 * 24 * 3600
    shutdown_timeout: float = 30.0
    burst: bool = False
    worker_id: str = dataclasses.field(default_factory=default_worker_id)

    @classmethod
    def from_settings(cls, executor: ReliableExecutor, **overrides: object) -> WorkerOptions:
        s = executor.settings
        values: dict[str, object] = dict(
            core_pool_size=s.CORE_POOL_SIZE,
            max_pool_size=s.MAX_POOL_SIZE,
            queue_capacity=s.QUEUE_CAPACITY,
            poll_interval=s.POLL_INTERVAL,
            lease_timeout=s.LEASE_TIMEOUT,
            master_lock_ttl=s.MASTER_LOCK_TTL,
            finished_retention=s.FINISHED_RETENTION,
        )
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


def format_queues(queues: Sequence[str], limits: dict[str, int]) -> str:
    """``mail:2,default``: each queue, with its limit when it has one."""
    return ",".join(f"{q}:{limits[q]}" if q in limits else q for q in queues)


class Worker:
    """One runexecutor process's worth of work. ``run()`` blocks until stopped."""

    def __init__(self, options: WorkerOptions, executor: ReliableExecutor | None = None) -> None:
        self.options = options
        self.executor = executor or default_executor
        self.worker_id = options.worker_id
        self.runner = TaskRunner(self.executor, options.lease_timeout)
        self.pool = BoundedPool(
            self.runner.run,
            core_size=options.core_pool_size,
            max_size=options.max_pool_size,
            queue_capacity=options.queue_capacity,
            queue_limits=options.queue_limits,
            on_freed=self._on_freed,
        )
        metrics.track_pool(lambda: self.pool.queued)
        self.master = MasterLock(self.executor.storage, self.worker_id, options.master_lock_ttl)
        # A worker silent for several heartbeats (which come every lease/4) is dead.
        self.heartbeat_interval = max(options.lease_timeout / 4, 0.05)
        self.scheduler = Scheduler(
            self.executor,
            options.finished_retention,
            max(options.lease_timeout * 2, 60.0),
            # Long enough for every live worker's heartbeat to come round once more.
            settle_seconds=self.heartbeat_interval * 1.5,
            # An outage this long can let a live worker's lease lapse (its last renewal came
            # up to a heartbeat interval before the outage, its next one up to one after).
            outage_seconds=options.lease_timeout / 2,
        )
        self.stopping = threading.Event()  # quiet: stop claiming, drain
        self.hard_stop = threading.Event()  # stop now, do not wait for handlers
        self._threads_done = threading.Event()
        self._registry_failing = False
        self.last_poll_at: float | None = None
        # Per-queue limits on Redis: the claim loop may block in wait_for_work while a limited
        # queue is full; a task of it finishing wakes the loop through this private wake key.
        self._wake_key = f"_worker:{self.worker_id}"
        self._waiting_blocked = False
        # max_concurrency of the registered handlers: enforced by the storage at each claim.
        self.name_limits = registry.name_limits()

    # -- control --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """First call: graceful stop. Second call: stop without waiting for handlers."""
        if self.stopping.is_set():
            self.hard_stop.set()
        self.stopping.set()
        if self.executor.storage.blocking_wait:
            # The claim loop may be blocked on Redis: wake it (from a thread, as this may run
            # in a signal handler).
            threading.Thread(target=self._interrupt_wait, daemon=True).start()

    def _interrupt_wait(self) -> None:
        try:
            self.executor.storage.wake(self.options.queues)
        except Exception:
            logger.debug("could not wake the claim loop; it stops within POLL_INTERVAL")

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> int:
        """Claim and execute until stopped (or, with ``burst``, until no work is near).
        Returns the process exit code: 0 after a graceful stop, 1 after a hard one."""
        opts = self.options
        logger.info(
            "worker %s starting: queues=%s pool=%d..%d queue_capacity=%d",
            self.worker_id,
            format_queues(opts.queues, opts.queue_limits),
            opts.core_pool_size,
            opts.max_pool_size,
            opts.queue_capacity,
        )
        background = [
            threading.Thread(
                target=self._heartbeat_loop, name="reliable-executor-heartbeat", daemon=True
            ),
            threading.Thread(
                target=self._scheduler_loop, name="reliable-executor-scheduler", daemon=True
            ),
        ]
        try:
            for warning in self.executor.storage.server_warnings():
                logger.warning(warning)
        except Exception:
            logger.exception("could not read the storage server's configuration")
        writer = self.runner.start_writer(self.pool.freed_elsewhere if opts.queue_limits else None)
        self._beat()
        for thread in background:
            thread.start()
        try:
            self._claim_loop()
        finally:
            code = self._shutdown()
            writer.close()  # record the completions still pending before leases are dropped
            self._threads_done.set()
            for thread in background:
                thread.join(timeout=5)
            self.master.release()
            try:
                self.executor.storage.worker_gone(self.worker_id)
            except Exception:
                logger.exception("could not unregister worker %s", self.worker_id)
            close_old_connections()
            logger.info("worker %s stopped", self.worker_id)
        return code

    def _allowances(self, budget: int) -> list[tuple[tuple[str, ...], int]]:
        """(queues, how many to claim) per claim call: each limited queue alone, up to its
        limit minus what is held of it here; then the unlimited queues together."""
        limits = self.options.queue_limits
        if not limits:
            return [(tuple(self.options.queues), budget)]
        # A completed task stays RUNNING until the writer has recorded it: it still counts.
        held = collections.Counter(self.pool.held_by_queue())
        if self.runner.writer is not None:
            held.update(claim.task.queue for claim in self.runner.writer.held())
        calls: list[tuple[tuple[str, ...], int]] = []
        for queue in self.options.queues:
            if queue in limits:
                calls.append(((queue,), max(0, limits[queue] - held.get(queue, 0))))
        unlimited = tuple(q for q in self.options.queues if q not in limits)
        if unlimited:
            calls.append((unlimited, budget))
        return calls

    def _claim_loop(self) -> None:
        """Claim while the pool has room; with per-queue limits, a queue at its limit is not
        claimed from, so none of it waits unseen here while the other queues keep flowing."""
        opts = self.options
        storage = self.executor.storage
        idle_wait = MIN_IDLE_WAIT
        error_wait = 0.5
        while not self.stopping.is_set():
            slots = self.pool.room()
            if slots <= 0:
                self.pool.wait_for_room(opts.poll_interval)
                continue
            version = self.pool.version
            budget = min(slots, CLAIM_BATCH)
            calls = self._allowances(budget)
            claimable = [queue for queues, n in calls if n > 0 for queue in queues]
            full = any(n <= 0 for _, n in calls)
            if not claimable:
                self.pool.wait_for_change(version, opts.poll_interval)
                continue
            claims: list[Claim] = []
            try:
                for queues, allowed in calls:
                    n = min(allowed, budget - len(claims))
                    if n > 0:
                        claims += storage.claim(
                            self.worker_id,
                            queues,
                            n,
                            opts.lease_timeout,
                            name_limits=self.name_limits or None,
                        )
                self.last_poll_at = time.time()
                error_wait = 0.5
            except Exception:
                logger.exception("claiming failed; retrying in %.1fs", error_wait)
                for claim in claims:
                    self.pool.submit(claim)
                drop_unusable_connections()
                self.stopping.wait(error_wait)
                error_wait = min(error_wait * 2, MAX_ERROR_WAIT)
                continue
            if claims:
                for claim in claims:
                    self.pool.submit(claim)
                idle_wait = MIN_IDLE_WAIT
                continue
            if opts.burst and self.pool.is_idle() and not self._work_near():
                logger.info("burst: no work due within %ds, stopping", BURST_HORIZON_SECONDS)
                return
            if storage.blocking_wait:
                # Redis: block until a submit wakes a queue, the next delayed task is due, or
                # (at a limit) a slot here frees up.
                self._waiting_blocked = full
                try:
                    if self.pool.version == version:
                        wait_on = claimable + ([self._wake_key] if full else [])
                        self._wait_for_work(opts.poll_interval, wait_on)
                finally:
                    self._waiting_blocked = False
                continue
            # Nothing due: wait, doubling the wait up to POLL_INTERVAL. A worker that just had
            # work looks again within milliseconds; an idle one asks once per POLL_INTERVAL.
            if full:
                self.pool.wait_for_change(version, idle_wait)
            else:
                self.stopping.wait(idle_wait)
            idle_wait = min(idle_wait * 2, opts.poll_interval)

    def _on_freed(self) -> None:
        """A pool thread: a claim of a limited queue left the pool."""
        if self._waiting_blocked:
            self.executor.storage.wake([self._wake_key])

    def _wait_for_work(self, timeout: float, queues: Sequence[str] | None = None) -> None:
        try:
            self.executor.storage.wait_for_work(queues or self.options.queues, timeout)
        except Exception:
            logger.exception("waiting for work failed; retrying in %.1fs", timeout)
            drop_unusable_connections()
            self.stopping.wait(timeout)

    def _work_near(self) -> bool:
        try:
            return self.executor.storage.has_work(self.options.queues, BURST_HORIZON_SECONDS)
        except Exception:
            logger.exception("burst: could not check for work")
            drop_unusable_connections()
            return True

    # -- shutdown -------------------------------------------------------------------------
    def _shutdown(self) -> int:
        # Phase 1 (quiet) happened: the claim loop returned. Phase 2: hand back what never
        # started, at once, with no attempt counted, so other workers can take it.
        unstarted = self.pool.take_queued()
        if unstarted:
            try:
                released = self.executor.storage.release(unstarted)
                logger.info("handed back %d unstarted claims", released)
            except Exception:
                logger.exception("could not hand back claims; their leases will expire")
                drop_unusable_connections()
        self.pool.close()
        # Phase 3: let running handlers finish, heartbeats still renewing their leases.
        deadline = time.monotonic() + self.options.shutdown_timeout
        while not self.hard_stop.is_set():
            remaining = deadline - time.monotonic()
            if self.pool.wait_idle(min(0.2, max(remaining, 0))):
                self.pool.join(1.0)
                return 0
            if remaining <= 0:
                break
        still = self.pool.running_ids()
        if still:
            logger.warning(
                "stopping with %d handlers still running (%s); their tasks are recovered "
                "after their lease expires",
                len(still),
                ", ".join(sorted(still)),
            )
        return 1 if self.hard_stop.is_set() else 0

    # -- background threads ---------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        previous = time.monotonic()
        while not self._threads_done.wait(self.heartbeat_interval):
            now = time.monotonic()
            self._warn_if_late(now - previous)
            previous = now
            self._beat()
        close_old_connections()

    def _warn_if_late(self, gap: float) -> None:
        """A round later than LEASE_TIMEOUT / 2 after the previous one puts the leases held here
        at risk: say so, with the usual causes (a thread pool cannot preempt a handler that
        holds the GIL; only a process pool can)."""
        limit = self.options.lease_timeout / 2
        if gap > limit:
            logger.warning(
                "heartbeat came %.2fs after the previous one, more than LEASE_TIMEOUT / 2 = "
                "%.2fs: leases not renewed within LEASE_TIMEOUT (%.2fs) are recovered and their "
                "tasks run again. A handler holding the GIL (one long call into C code), an "
                "overloaded machine or a paused process delays the heartbeat thread",
                gap,
                limit,
                self.options.lease_timeout,
            )

    def _beat(self) -> None:
        """Renew the leases of every claim held here, then refresh this worker's row in the
        worker registry: separate writes, so that no other write can keep leases from renewal."""
        self._renew_leases()
        self._register()

    def _register(self) -> None:
        try:
            self.executor.storage.worker_seen(
                self.worker_id,
                {
                    "hostname": socket.gethostname(),
                    "pid": os.getpid(),
                    "queues": list(self.options.queues),
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
                    self.options.lease_timeout,
                )
                break
            except Exception:
                # A connection the server killed fails once: renew again at once on a new one.
                if first_try and drop_unusable_connections():
                    continue
                logger.exception("heartbeat: renewing %d leases failed", len(claims))
                self.scheduler.storage_failed()
                drop_unusable_connections()
                return
        self.scheduler.storage_reached()
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

    def _scheduler_loop(self) -> None:
        tick = min(1.0, self.options.master_lock_ttl / 4)
        was_master = False
        synced = False
        while not self._threads_done.is_set():
            busy = False
            wait = tick
            if not synced:
                synced = self._sync_declared_schedules()
            try:
                is_master = self.master.hold()
                if not self.master.reachable:
                    self.scheduler.storage_failed()
                if is_master and not was_master:
                    self.scheduler.settle()
                was_master = is_master
                if is_master:
                    busy = self.scheduler.run_once()
                    wait = self.scheduler.seconds_to_next_schedule(tick)
            except Exception:
                logger.exception("scheduler round failed")
                # No settle here: recovery is held back once the storage is reached again
                # (storage_reached), so errors that keep coming cannot postpone it forever.
                self.scheduler.storage_failed()
                drop_unusable_connections()
            self._threads_done.wait(0.01 if busy else max(wait, 0.001))
        close_old_connections()

    def _sync_declared_schedules(self) -> bool:
        """Save the schedules declared in code, once per start. False to try again next round
        (the storage could not be reached); a definition the storage refuses is logged and
        not tried again — it must never keep this worker from its chores."""
        try:
            written = self.executor.sync_declared_schedules()
        except ReliableExecutorError as exc:
            if isinstance(exc, StorageUnavailableError):
                logger.warning("cannot save the schedules declared in code yet: %s", exc)
                return False
            logger.error("the schedules declared in code were not saved: %s", exc)
            return True
        except DatabaseError as exc:
            logger.warning("cannot save the schedules declared in code yet: %s", exc)
            drop_unusable_connections()
            return False
        if written:
            logger.info("saved %d schedule(s) declared in code", written)
        return True
