"""The fetcher: claims work into the pool within each queue's limit; backs off idle or failing."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence

from .. import registry
from ..connections import drop_unusable_connections
from ..core.records import Claim
from ..service.reliable_executor import ReliableExecutor
from .pool import BoundedPool
from .runner import TaskRunner

logger = logging.getLogger("django_reliable_executor")

CLAIM_BATCH = 100  # most claims taken in one round trip
MIN_IDLE_WAIT = 0.005  # first wait after the queue ran dry; doubles up to POLL_INTERVAL
BURST_HORIZON_SECONDS = 60.0
MIN_ERROR_WAIT = 0.5  # first pause after a failed claim; doubles up to MAX_ERROR_WAIT
MAX_ERROR_WAIT = 5.0  # longest pause between claims while the storage is unreachable


class Fetcher:
    """One worker's claim loop (Sidekiq's fetch, dramatiq's consumer). ``run()`` claims into
    ``pool`` until ``stopping`` is set or, in burst mode, until no work is near.

    With per-queue limits, a queue at its limit is not claimed from, so none of it waits unseen
    here while the other queues keep flowing. An idle fetcher waits in the storage's
    ``wait_for_work`` until a submit wakes one of its queues (Redis, PostgreSQL, SQLite; on
    MariaDB the wait is a short poll), a delayed task is due, (at a limit) a slot here frees up,
    or POLL_INTERVAL has passed.
    """

    def __init__(
        self,
        executor: ReliableExecutor,
        pool: BoundedPool,
        runner: TaskRunner,
        stopping: threading.Event,
        *,
        worker_id: str,
        queues: Sequence[str],
        queue_limits: dict[str, int],
        lease_timeout: float,
        poll_interval: float,
        burst: bool,
        start_at_claim: bool = True,
        free_to_start: Callable[[], int] | None = None,
    ) -> None:
        self.executor = executor
        self.pool = pool
        self.runner = runner
        self.stopping = stopping
        self.worker_id = worker_id
        self.queues = queues
        self.queue_limits = queue_limits
        self.lease_timeout = lease_timeout
        self.poll_interval = poll_interval
        self.burst = burst
        # The claim starts the tasks idle threads run at once (where the storage can); not
        # under --pool process, whose threads start a task once a child is ready for it.
        self.start_at_claim = start_at_claim
        # How many claims could start now where fewer than the idle threads can: under
        # --pool process, the children free (two threads wait on each child). None: the idle
        # threads.
        self.free_to_start = free_to_start
        # max_concurrency of the registered handlers: enforced by the storage at each claim.
        self.name_limits = registry.name_limits()
        # rate_limit of the registered handlers: enforced by the storage at each claim (and
        # at each start, see storage/database/rate_starts.py).
        self.rate_limits = registry.rate_limits()
        # max_concurrency_per_key of the registered handlers: enforced as name_limits is.
        self.key_limits = registry.key_limits()
        # fairness="round_robin" of the registered handlers: their tasks are claimed only for
        # threads (under --pool process, children) free to start them, so the storage's turns
        # are the order they run in (a backlog claimed ahead into the local queue, or a task
        # waiting in a pool thread for a busy child, would run before a later key's turn).
        self.fair_names = registry.fair_names()
        self.last_poll_at: float | None = None  # time.time() of the last claim that succeeded
        self._idle_wait = MIN_IDLE_WAIT
        # Whether every call of the last claim took fewer than it asked (see run).
        self._drained = False
        self._error_wait = MIN_ERROR_WAIT
        # Per-queue limits: the fetcher may block in wait_for_work while a limited queue is
        # full; a task of it finishing wakes the fetcher through this private wake key.
        self._wake_key = f"_worker:{worker_id}"
        self._waiting_blocked = False

    def run(self) -> None:
        """Claim while the pool has room, until stopped or (burst) out of work. Blocking."""
        while not self.stopping.is_set():
            slots = self.pool.room()
            if slots <= 0:
                self.pool.wait_for_room(self.poll_interval)
                continue
            version = self.pool.version
            budget = min(slots, CLAIM_BATCH)
            calls = self.allowances(budget)
            claimable = [queue for queues, n in calls if n > 0 for queue in queues]
            # With fair names, a thread freed here may let the next turn be claimed: wait for
            # it as for a limited queue's slot (the pool wakes us when a fair claim leaves).
            full = any(n <= 0 for _, n in calls) or bool(self.fair_names)
            if not claimable:
                self.pool.wait_for_change(version, self.poll_interval)
                continue
            claims = self._claim(calls, budget)
            if claims is None:
                continue
            if claims:
                self.pool.submit_many(claims)
                self._idle_wait = MIN_IDLE_WAIT
                if self._drained and not self.burst:
                    # Every claim call took fewer than it asked: nothing more was claimable.
                    # Wait for new work as after an empty claim (a submit since this claim ends
                    # the wait at once), rather than claim again first: at a steady moderate
                    # rate, one claim round per wake-up instead of two, the second finding
                    # nothing.
                    self._idle(version, claimable, full)
                continue
            if self.burst:
                # Near the burst's end, look again at growing intervals rather than wait for
                # new work, which no ending here wakes: the burst would end up to
                # POLL_INTERVAL after its last task.
                if not self.pool.is_idle():
                    self.pool.wait_idle(self._idle_wait)  # its last tasks run
                elif self._recording():
                    # Their outcomes wait for the completion writer: RUNNING till then, so
                    # asking the storage whether work is near would only find them.
                    self.stopping.wait(self._idle_wait)
                elif not self._work_near():
                    logger.info("burst: no work due within %ds, stopping", BURST_HORIZON_SECONDS)
                    return
                else:  # due soon, or RUNNING in another worker
                    self._wait_for_work(self._idle_wait, claimable)
                self._idle_wait = min(self._idle_wait * 2, self.poll_interval)
                continue
            self._idle(version, claimable, full)

    def allowances(self, budget: int) -> list[tuple[tuple[str, ...], int]]:
        """(queues, how many to claim) per claim call: each limited queue alone, up to its
        limit minus what is held of it here; then the unlimited queues together."""
        limits = self.queue_limits
        if not limits:
            return [(tuple(self.queues), budget)]
        # A completed task stays RUNNING until the writer has recorded it: it still counts.
        held = collections.Counter(self.pool.held_by_queue())
        if self.runner.writer is not None:
            held.update(claim.task.queue for claim in self.runner.writer.held())
        calls: list[tuple[tuple[str, ...], int]] = []
        for queue in self.queues:
            if queue in limits:
                calls.append(((queue,), max(0, limits[queue] - held.get(queue, 0))))
        unlimited = tuple(q for q in self.queues if q not in limits)
        if unlimited:
            calls.append((unlimited, budget))
        return calls

    def _claim(self, calls: list[tuple[tuple[str, ...], int]], budget: int) -> list[Claim] | None:
        """Claim up to ``budget`` over ``calls``. None after a failure: what was claimed before
        it went to the pool, and the next try comes after a pause doubling up to MAX_ERROR_WAIT."""
        claims: list[Claim] = []
        # Claims that idle threads will run at once are started by the claim itself (where the
        # storage can): one round trip less, and a submitted task starts that much sooner.
        # Not under --pool process: there a start waits until a child is ready (process_pool.py).
        idle = self.pool.idle_threads()
        start = idle if self.start_at_claim else 0
        fair_left = None
        if self.fair_names:
            fair_left = idle if self.free_to_start is None else min(idle, self.free_to_start())
        self._drained = True
        try:
            for queues, allowed in calls:
                n = min(allowed, budget - len(claims))
                if n > 0:
                    taken = self.executor.storage.claim(
                        self.worker_id,
                        queues,
                        n,
                        self.lease_timeout,
                        name_limits=self.name_limits or None,
                        start=start,
                        rate_limits=self.rate_limits or None,
                        key_limits=self.key_limits or None,
                        fair_limit=fair_left,
                    )
                    start -= self.runner.claimed(taken)
                    if fair_left is not None:
                        fair_left -= sum(c.task.task_name in self.fair_names for c in taken)
                    claims += taken
                    self._drained = self._drained and len(taken) < n
            self.last_poll_at = time.time()
            self._error_wait = MIN_ERROR_WAIT
        except Exception:
            logger.exception("claiming failed; retrying in %.1fs", self._error_wait)
            for claim in claims:
                self.pool.submit(claim)
            drop_unusable_connections()
            self.stopping.wait(self._error_wait)
            self._error_wait = min(self._error_wait * 2, MAX_ERROR_WAIT)
            return None
        return claims

    def _idle(self, version: int, claimable: list[str], full: bool) -> None:
        """Nothing was claimed: wait for work. ``full``: some limited queue is at its limit, so
        a slot freed here (the pool's version moving on from ``version``) ends the wait too."""
        if self.executor.storage.blocking_wait:
            # Block until a submit wakes a queue, the next delayed task is due, (at a limit) a
            # slot here frees up, or POLL_INTERVAL has passed (see the storage's waiter).
            self._waiting_blocked = full
            # Fair names: a thread freed by any task may take their next turn.
            self.pool.wake_any = bool(self.fair_names)
            try:
                if self.pool.version == version:
                    wait_on = claimable + ([self._wake_key] if full else [])
                    self._wait_for_work(self.poll_interval, wait_on)
            finally:
                self._waiting_blocked = False
                self.pool.wake_any = False
            return
        # A storage that cannot wait (none of the shipped ones): poll, doubling the wait up to
        # POLL_INTERVAL. A worker that just had work looks again within milliseconds.
        if full:
            self.pool.wait_for_change(version, self._idle_wait)
        else:
            self.stopping.wait(self._idle_wait)
        self._idle_wait = min(self._idle_wait * 2, self.poll_interval)

    def on_freed(self) -> None:
        """A pool thread: a claim of a limited queue left the pool."""
        if self._waiting_blocked:
            self.executor.storage.wake([self._wake_key])

    def interrupt(self) -> None:
        """Wake a blocking wait for work so that the loop sees ``stopping`` at once."""
        try:
            self.executor.storage.wake(self.queues)
        except Exception:
            logger.debug("could not wake the claim loop; it stops within POLL_INTERVAL")

    def _wait_for_work(self, timeout: float, queues: Sequence[str] | None = None) -> None:
        try:
            self.executor.storage.wait_for_work(queues or self.queues, timeout)
        except Exception:
            logger.exception("waiting for work failed; retrying in %.1fs", timeout)
            drop_unusable_connections()
            self.stopping.wait(timeout)

    def _recording(self) -> bool:
        """The completion writer holds outcomes it has not written yet."""
        writer = self.runner.writer
        return writer is not None and bool(writer.held())

    def _work_near(self) -> bool:
        try:
            # The tasks of a paused queue wait for its resume, not for this worker.
            paused = self.executor.storage.paused_queues()
            queues = [queue for queue in self.queues if queue not in paused]
            return bool(queues) and self.executor.storage.has_work(queues, BURST_HORIZON_SECONDS)
        except Exception:
            logger.exception("burst: could not check for work")
            drop_unusable_connections()
            return True
