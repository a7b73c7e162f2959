"""The runexecutor worker: runs the fetcher, bounded pool, heartbeat and chores threads, and the
phased shutdown (quiet -> hand back unstarted claims -> drain -> stop)."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from django.db import close_old_connections

from .. import registry
from ..connections import drop_unusable_connections
from ..exceptions import StorageUnavailableError
from ..master.loop import MasterLoop
from ..observability import metrics
from ..service.reliable_executor import ReliableExecutor
from ..service.reliable_executor import executor as default_executor
from .event_loop import EventLoop
from .fetcher import Fetcher
from .heartbeat import Heartbeat
from .pool import BoundedPool
from .runner import TaskRunner
from .stacks import StackResponder

if TYPE_CHECKING:
    from .process_pool import ProcessPool

logger = logging.getLogger("django_reliable_executor")


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
    # Most async handlers running at once on the worker's event loop; 0: no event loop, an
    # async handler takes a pool thread (through async_to_sync).
    async_concurrency: int = 100
    # "thread": handlers run in the pool's threads; "process": each pool thread (max_pool_size
    # of them) runs its handlers in a child process, replaced after max_tasks_per_child tasks.
    pool: str = "thread"
    max_tasks_per_child: int | None = None
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
            async_concurrency=s.ASYNC_CONCURRENCY,
            pool=s.POOL,
            max_tasks_per_child=s.MAX_TASKS_PER_CHILD,
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


def process_pool(runner: TaskRunner, options: WorkerOptions) -> ProcessPool | None:
    """With ``--pool process``, the children that run the handlers (pool threads wait on
    them); None for the thread pool."""
    if options.pool != "process":
        return None
    from .process_pool import ProcessPool  # multiprocessing is loaded only when used

    return ProcessPool(
        runner, size=options.max_pool_size, max_tasks_per_child=options.max_tasks_per_child
    )


class Worker:
    """One runexecutor process's worth of work. ``run()`` blocks until stopped."""

    def __init__(self, options: WorkerOptions, executor: ReliableExecutor | None = None) -> None:
        self.options = options
        self.executor = executor or default_executor
        self.worker_id = options.worker_id
        self.runner = TaskRunner(self.executor, options.lease_timeout)
        self.event_loop = (
            # Blocked for half a lease: the worker stops registering (health reports it).
            EventLoop(self.runner, stall_seconds=options.lease_timeout / 2)
            if options.async_concurrency
            else None
        )
        self.processes = process_pool(self.runner, options)
        self.pool = self._build_pool(options)
        metrics.track_pool(lambda: self.pool.queued)
        # A worker silent for several heartbeats (which come every lease/4) is dead.
        self.heartbeat_interval = max(options.lease_timeout / 4, 0.05)
        self.stopping = threading.Event()  # quiet: stop claiming, drain
        # A stop also hands a task that uses durable steps back at its next step.
        self.runner.stopping = self.stopping
        self._threads_done = threading.Event()
        self.master_loop = MasterLoop(
            self.executor,
            self.worker_id,
            lease_timeout=options.lease_timeout,
            master_lock_ttl=options.master_lock_ttl,
            finished_retention=options.finished_retention,
            heartbeat_interval=self.heartbeat_interval,
            done=self._threads_done,
        )
        self._layout_checked = False  # _check_layout passed
        self.hard_stop = threading.Event()  # stop now, do not wait for handlers
        self.heartbeat = self._build_heartbeat(options)
        self.fetcher = Fetcher(
            self.executor,
            self.pool,
            self.runner,
            self.stopping,
            worker_id=self.worker_id,
            queues=options.queues,
            queue_limits=options.queue_limits,
            lease_timeout=options.lease_timeout,
            poll_interval=options.poll_interval,
            burst=options.burst,
            start_at_claim=self.processes is None,
            free_to_start=self._free_children if self.processes is not None else None,
        )

    def _build_heartbeat(self, options: WorkerOptions) -> Heartbeat:
        """The heartbeat thread's loop: it renews leases, supervises the pools and answers the
        live-stack requests made for this worker between beats."""
        return Heartbeat(
            self.executor,
            self.pool,
            self.runner,
            self.master_loop.chores,
            self._threads_done,
            worker_id=self.worker_id,
            queues=options.queues,
            lease_timeout=options.lease_timeout,
            interval=self.heartbeat_interval,
            # The pool's threads and the event loop's, checked (and replaced once dead) at
            # every beat.
            supervised=[self.pool.supervise]
            + ([self.event_loop.supervise] if self.event_loop is not None else []),
            serve_stacks=StackResponder(
                self.executor,
                self.worker_id,
                self.runner,
                self.pool,
                self.processes,
                self._threads_done,
                self.event_loop,
            ).serve,
        )

    def _build_pool(self, options: WorkerOptions) -> BoundedPool:
        """The bounded pool that runs the claims: its threads run handlers, or wait for the
        process pool's children to (``--pool process``)."""
        threads = options.max_pool_size if self.processes is None else self.processes.threads
        return BoundedPool(
            self.runner.run if self.processes is None else self.processes.run,
            core_size=options.core_pool_size if self.processes is None else threads,
            max_size=threads,
            queue_capacity=options.queue_capacity,
            queue_limits=options.queue_limits,
            # A slot of a limited queue freed: the fetcher (built below) may be waiting for it.
            on_freed=lambda: self.fetcher.on_freed(),
            fair_names=registry.fair_names(),
            async_capacity=options.async_concurrency,
            run_async=self.event_loop.run if self.event_loop is not None else None,
            is_async=self.runner.is_async,
            # Threads start claims for each other (see pool.py); under --pool process each
            # starts its own, as it may then wait for a child.
            start=self.runner.start_many if self.processes is None else None,
            lost=self.runner.lose,
        )

    def _free_children(self) -> int:
        """--pool process: the children free to start a task now (the fetcher claims fair
        names for these only). The pool's claims are read first: see free_children()."""
        assert self.processes is not None
        return self.processes.free_children(self.pool.thread_claims())

    @property
    def last_poll_at(self) -> float | None:
        """time.time() of the last claim round that reached the storage; None before one."""
        return self.fetcher.last_poll_at

    # -- control --------------------------------------------------------------------------
    def request_stop(self) -> None:
        """First call: graceful stop. Second call: stop without waiting for handlers."""
        if self.stopping.is_set():
            self.hard_stop.set()
        self.stopping.set()
        if self.processes is not None:
            self.processes.stop_at_steps()
        if self.executor.storage.blocking_wait:
            # The claim loop may be blocked waiting for work: wake it (from a thread, as this
            # may run in a signal handler).
            threading.Thread(target=self.fetcher.interrupt, daemon=True).start()

    def prepare(self) -> None:
        """Start what must be up before the worker says it is ready: the process pool's
        children, each with Django set up. ``run()`` does it too, if not done. Raises
        ImproperlyConfigured when the storage's layout is not the other processes' (a Redis
        REDIS_SHARDS other than the recorded one): such a worker would never see their tasks."""
        self._check_layout()
        if self.processes is not None:
            self.processes.start()

    def _check_layout(self) -> None:
        """storage.check_layout, once; while the storage cannot be reached, tried again (0.5 s,
        doubling up to 5 s) until it answers or a stop is asked for: a worker started during
        an outage waits for it, as its claims would, rather than exit."""
        wait = 0.5
        while not self._layout_checked:
            try:
                self.executor.storage.check_layout()
                self._layout_checked = True
            except StorageUnavailableError as exc:
                logger.warning(
                    "could not check the storage's layout (%s); again in %.1fs", exc, wait
                )
                if self.stopping.wait(wait):
                    return
                wait = min(wait * 2, 5.0)

    # -- main loop ------------------------------------------------------------------------
    def run(self) -> int:
        """Claim and execute until stopped (or, with ``burst``, until no work is near).
        Returns the process exit code: 0 after a graceful stop, 1 after a hard one."""
        opts = self.options
        if self.processes is None:
            pool = f"{opts.core_pool_size}..{opts.max_pool_size} threads"
        else:
            pool = f"{opts.max_pool_size} processes"
        logger.info(
            "worker %s starting: queues=%s pool=%s queue_capacity=%d async_concurrency=%d",
            self.worker_id,
            format_queues(opts.queues, opts.queue_limits),
            pool,
            opts.queue_capacity,
            opts.async_concurrency,
        )
        background = [
            threading.Thread(
                target=self.heartbeat.run, name="reliable-executor-heartbeat", daemon=True
            ),
            threading.Thread(
                target=self.master_loop.run, name="reliable-executor-chores", daemon=True
            ),
        ]
        try:
            for warning in self.executor.storage.server_warnings():
                logger.warning(warning)
            paused = sorted(set(opts.queues) & self.executor.paused_queues())
            if paused:
                logger.warning("paused queues, claimed from once resumed: %s", ", ".join(paused))
        except Exception:
            logger.exception("could not read the storage server's configuration")
        writer = self.runner.start_writer(self.pool.freed_elsewhere if opts.queue_limits else None)
        self.prepare()
        self.heartbeat.beat()
        for thread in background:
            thread.start()
        try:
            self.fetcher.run()
        finally:
            self.executor.storage.stop_waiting()  # the claim loop's LISTEN connection
            code = self._shutdown()
            if self.processes is not None:
                self.processes.close()
            writer.close()  # record the completions still pending before leases are dropped
            self.runner.progress.close()  # every task's last report was written at its end
            self._threads_done.set()
            for thread in background:
                thread.join(timeout=5)
            self.master_loop.release()
            try:
                self.executor.storage.worker_gone(self.worker_id)
            except Exception:
                logger.exception("could not unregister worker %s", self.worker_id)
            close_old_connections()
            logger.info("worker %s stopped", self.worker_id)
        return code

    # -- shutdown -------------------------------------------------------------------------
    def _shutdown(self) -> int:
        # Phase 1 (quiet) happened: the claim loop returned. Phase 2: hand back what never
        # started, at once, with no attempt counted, so other workers can take it. Under --pool
        # process, so does a pool thread still waiting for a child (its task is not started).
        if self.processes is not None:
            self.processes.quiet()
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
                if self.event_loop is not None:
                    self.event_loop.stop()
                return 0
            if remaining <= 0:
                break
        self._warn_left_running()
        return 1 if self.hard_stop.is_set() else 0

    def _warn_left_running(self) -> None:
        """Say what becomes of the handlers still running as the worker stops: a child of the
        process pool is stopped now and its attempt recorded (processes.close()); a thread or
        an event-loop handler is left to die with the process, its task recovered once its
        lease expires."""
        still = self.pool.running_ids()
        in_children = still - self.pool.async_running_ids() if self.processes is not None else set()
        left = still - in_children
        if in_children:
            logger.warning(
                "stopping with %s still running in child processes (%s); the children "
                "are stopped now and each attempt is recorded as failed (retried while the task "
                "has retries left)",
                _handlers(len(in_children)),
                ", ".join(sorted(in_children)),
            )
        if left:
            logger.warning(
                "stopping with %s still running (%s); their tasks are recovered "
                "after their lease expires",
                _handlers(len(left)),
                ", ".join(sorted(left)),
            )


def _handlers(count: int) -> str:
    """ "1 handler", "3 handlers"."""
    return f"{count} handler" if count == 1 else f"{count} handlers"
