"""A bounded thread pool with core/max threads and a local queue, in task priority order.

Semantics follow Java's ThreadPoolExecutor: core threads start at once; claims wait
in the local queue; only when more than ``queue_capacity`` wait does the pool grow towards
``max_size`` threads, and extra threads retire after a minute idle. The fetcher asks
``free_slots()`` before claiming, so nothing is ever rejected and nothing waits unseen.

With a ``start`` function (the thread pool's), a thread about to run a claim not yet started
writes the start of the next claims for itself and for every thread waiting for work, in one
call, and those threads take them from a ready queue one after the other: a thread wakes the
next only as it takes one, so a batch costs one wake-up rather than one per task, and a thread
back from a short task runs the next started claim without sleeping at all. Claims are started
only for threads that wait for work now, so each runs at once (its ``started_at`` is true).

Claims of ``async def`` handlers take no thread: they go to the event loop (see
pool_async.py).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping

from django.db import connections

from ..connections import tidy_connections
from ..core.records import Claim
from ..core.states import TaskStatus
from ..exceptions import StorageUnavailableError
from .pool_async import EventLoopSide
from .pool_state import RunAsync

logger = logging.getLogger("django_reliable_executor")

KEEP_ALIVE_SECONDS = 60.0
_QUEUE = operator.attrgetter("task.queue")
STARTED_FIRST = -(2**63)  # the heap key of a claim already started: before any priority

# lost(claims, why): a pool thread died holding these claims (started or not).
Lost = Callable[[list[Claim], str], object]
THREAD_DIED = "the worker's pool thread running the task died"

# start(claims): start these claims in one write, for threads about to run them: each as
# started, as it was (to run as is: past its deadline, say), or None (not ours any more).
StartMany = Callable[[list[Claim]], list[Claim | None]]


class BoundedPool(EventLoopSide):
    """Core and extra threads running claims from the local queue (see the module's doc)."""

    def __init__(
        self,
        run: Callable[[Claim], object],
        *,
        core_size: int,
        max_size: int,
        queue_capacity: int,
        name: str = "reliable-executor",
        queue_limits: Mapping[str, int] | None = None,
        on_freed: Callable[[], object] | None = None,
        fair_names: Collection[str] = (),
        async_capacity: int = 0,
        run_async: RunAsync | None = None,
        is_async: Callable[[Claim], bool] | None = None,
        start: StartMany | None = None,
        lost: Lost | None = None,
    ) -> None:
        super().__init__(
            max_size=max(max_size, core_size),
            queue_capacity=queue_capacity,
            queue_limits=queue_limits,
            on_freed=on_freed,
            fair_names=fair_names,
            async_capacity=async_capacity,
            run_async=run_async,
            is_async=is_async,
        )
        self._run = run
        self._lost = lost
        self.thread_deaths = 0  # pool threads that died (and were replaced) so far
        self._start = start
        self.core_size = core_size
        self._name = name
        self._threads = 0
        self._idle = 0  # threads waiting on _work
        self._freeing = 0  # threads that ran a claim, between telling it and their next _take
        self._wake_sent = False  # one of them was woken and has not looked for work yet
        # Claims a thread started for the threads waiting here, in priority order; and while a
        # start is written, how many of its claims are meant for other threads than its writer.
        self._ready: deque[Claim] = deque()
        self._starting = False
        self._promised = 0
        self._thread_ids = itertools.count(1)
        for _ in range(core_size):
            self._spawn(core=True)
        if self.async_capacity:
            threading.Thread(target=self._feed, name=f"{name}-async-feeder", daemon=True).start()

    # -- the fetcher's side ---------------------------------------------------------------

    def idle_threads(self) -> int:
        """Threads waiting for a claim that none queued here is meant for yet: claims handed to
        the pool now would run at once (the fetcher has those started as it claims them)."""
        with self._cond:
            idle = self._idle + self._freeing
            return max(0, idle - len(self._heap) - len(self._ready) - self._promised)

    def thread_claims(self) -> int:
        """Claims for the threads queued or taken by one (starting, ready, running, or done
        and not given back yet); the event loop's not counted."""
        with self._cond:
            return len(self._heap) + len(self._running)

    def submit(self, claim: Claim) -> None:
        self.submit_many([claim])

    def submit_many(self, claims: list[Claim]) -> None:
        """Queue claims (the fetcher's batch) under one lock, waking one idle thread (it wakes
        the next as it takes a claim) and the event loop's feeder if it has claims."""
        to_loop = self._to_event_loop_many(claims)
        with self._cond:
            threads = len(claims) - sum(to_loop)
            heaps, order, running = (self._heap, self._async_heap), self._order, TaskStatus.RUNNING
            for claim, is_async in zip(claims, to_loop, strict=True):
                task = claim.task
                # A started claim first: it was started for a thread that is idle now.
                first = STARTED_FIRST if task.status is running else -task.priority
                heapq.heappush(heaps[is_async], (first, next(order), claim))
            if threads < len(claims):
                self._async_work.notify()
            if not threads:
                return
            if not self._idle:
                extra = min(len(self._heap) - self.queue_capacity, self.max_size - self._threads)
                for _ in range(extra):
                    self._spawn(core=False)
            self._wake_next()  # one thread: it wakes the next as it takes its claim

    def close(self) -> None:
        """Let threads exit once the queue is empty (running tasks are not interrupted)."""
        with self._cond:
            self._closed = True
            self._work.notify_all()
            self._async_work.notify_all()
            self._changed.notify_all()

    # -- the threads' side ----------------------------------------------------------------
    def _spawn(self, *, core: bool) -> None:
        thread = threading.Thread(
            target=self._serve,
            args=(core,),
            name=f"{self._name}-{next(self._thread_ids)}",
            daemon=True,  # a hard stop must not wait for a handler that never returns
        )
        thread.start()
        self._threads += 1

    def supervise(self) -> str | None:
        """The heartbeat's check: the pool has its core threads (one that died is replaced at
        once by itself; should that fail, here). Raises when a thread cannot be started; None
        (nothing wrong now) otherwise."""
        with self._cond:
            missing = 0 if self._closed else self.core_size - self._threads
            for _ in range(missing):
                self._spawn(core=True)
            if missing > 0:
                self._wake_next()
        if missing > 0:
            logger.warning("started %d pool threads in place of threads that died", missing)
        return None

    def _serve(self, core: bool) -> None:
        """A pool thread. Whatever ends it early (a BaseException let out of a handler or of
        the worker's own code) is supervised here: its claims are failed or handed back
        (``lost``), and a new thread takes its place."""
        holding: list[Claim] = []  # what this thread took and has not given back
        try:
            self._loop(core, holding)
        except BaseException as exc:  # noqa: BLE001 - the thread is replaced, never lost
            self._thread_died(core, holding, exc)

    def _thread_died(self, core: bool, holding: list[Claim], exc: BaseException) -> None:
        why = f"{THREAD_DIED}: {type(exc).__name__}: {exc}"
        logger.error("%s; replacing it", why, exc_info=exc)
        with self._cond:
            self.thread_deaths += 1
            self._threads -= 1
            if (
                self._starting
                and holding
                and any(claim.task_id in self._running for claim in holding)
            ):
                self._starting = False  # it was writing a start: nobody else will finish it
                self._promised = 0
            for claim in holding:
                self._running.pop(claim.task_id, None)
            freed = self._release(holding)
            self._changed.notify_all()
            if not self._closed or self._heap or self._ready:
                try:
                    self._spawn(core=core)
                except Exception:  # the heartbeat's supervise() tries again
                    logger.exception("could not start a pool thread in place of a dead one")
            self._wake_next()
        if holding and self._lost is not None:
            try:
                self._lost(list(holding), why)
            except Exception:
                logger.exception("could not record the claims of a dead pool thread")
            finally:
                tidy_connections()
        self._notify_freed(freed)
        connections.close_all()

    def _loop(self, core: bool, holding: list[Claim]) -> None:
        done: Claim | None = None  # the claim this thread just ran
        starts: tuple[list[Claim], list[Claim | None]] | None = None  # the start it just wrote
        freeing = False  # this thread ran a claim and tells the fetcher before it takes one
        while True:
            # One turn of the lock both gives back what was done and takes the next claim.
            with self._cond:
                if freeing:
                    self._freeing -= 1  # back in _take: idle (waiting) or busy again
                    freeing = False
                freed = done is not None and self._done(done)
                if starts is not None:
                    freed = self._started(*starts) or freed
                holding.clear()
                item = None if freed else self._take(core)
                if freed and done is not None:
                    # Until it is back in _take it counts as idle: the fetcher the notice
                    # below wakes must find a thread for a fair name's next turn.
                    self._freeing += 1
                    freeing = True
                if item is not None:
                    holding[:] = item if type(item) is list else [item]  # type: ignore[list-item]
            done = starts = None
            if freed:
                try:
                    self._notify_freed(True)  # outside the lock; the next claim on the next turn
                except BaseException:  # the thread dies (_serve): it is idle no more
                    if freeing:
                        with self._cond:
                            self._freeing -= 1
                    raise
                continue
            if item is None:
                break
            if type(item) is list:  # claims to start: this thread's, then the waiting threads'
                starts = (item, self._start_batch(item))
                continue
            claim: Claim = item  # type: ignore[assignment]
            try:
                self._run(claim)
            except StorageUnavailableError as exc:
                logger.warning(
                    "task %s: %s; the claim is recovered once its lease expires", claim.task_id, exc
                )
            except Exception:
                logger.exception("task %s: unexpected error in the worker", claim.task_id)
            finally:
                tidy_connections()
                done = claim
        connections.close_all()  # this thread's connections die with it

    def _take(self, core: bool) -> Claim | list[Claim] | None:
        """What this thread does next (lock held), waiting until there is something: a claim
        to run, claims to start (a list: its own first), or None when this thread is to exit
        (closed with nothing left, or an extra thread idle for KEEP_ALIVE_SECONDS)."""
        idle_since = 0.0
        heap, ready = self._heap, self._ready
        while True:
            if ready:
                claim = ready.popleft()
                self._wake_next()
                return claim
            if heap and (self._start is None or heap[0][0] == STARTED_FIRST):
                claim = heapq.heappop(heap)[2]  # started by the claim, or started by its thread
                self._running[claim.task.task_id] = claim
                if len(heap) == self.queue_capacity // 2:
                    self._changed.notify_all()  # room for a refill
                self._wake_next()
                return claim
            if heap and not self._starting:
                return self._take_starts()
            if self._closed and not heap and not self._starting:
                break
            if not idle_since:
                idle_since = time.monotonic()
            elif (
                not core
                and not self._starting  # a claim being started may be meant for this thread
                and time.monotonic() - idle_since > KEEP_ALIVE_SECONDS
            ):
                break
            self._idle += 1
            try:
                self._work.wait(1.0 if core else KEEP_ALIVE_SECONDS)
            finally:
                self._idle -= 1
                # Woken or timed out, this thread looks now: the next wake may be sent. (Which
                # waiter was woken cannot be told apart from one timing out at that moment; at
                # worst one thread more wakes for nothing.)
                self._wake_sent = False
        self._threads -= 1
        self._changed.notify_all()
        return None

    def _take_starts(self) -> list[Claim]:
        """The claims to start now (lock held; the heap's first is not started): one for this
        thread and one for each thread waiting for work, which nothing else is meant for."""
        heap = self._heap
        wanted = min(1 + self._idle, len(heap))
        batch = [heapq.heappop(heap)[2] for _ in range(wanted)]
        running = self._running
        for claim in batch:
            running[claim.task.task_id] = claim
        half = self.queue_capacity // 2
        if len(heap) <= half < len(heap) + wanted:
            self._changed.notify_all()  # room for a refill
        self._starting = True
        self._promised = wanted - 1
        return batch

    def _start_batch(self, batch: list[Claim]) -> list[Claim | None]:
        """Write the batch's start (no lock held). Should ``start`` raise, the claims are
        dropped here: their leases lapse and they are recovered."""
        assert self._start is not None
        try:
            started = self._start(batch)
            if len(started) != len(batch):
                raise RuntimeError(f"{len(started)} claims started for {len(batch)}")
            return started
        except Exception:
            logger.exception("could not start %d tasks; their claims are recovered", len(batch))
            return [None] * len(batch)

    def _started(self, batch: list[Claim], started: list[Claim | None]) -> bool:
        """A start was written (lock held): its claims go to the ready queue, in order, but
        those no longer ours, which leave the pool. True when a limited queue got room."""
        self._starting = False
        self._promised = 0
        running, ready, gone = self._running, self._ready, []
        for claim, now in zip(batch, started, strict=True):
            if now is None:
                running.pop(claim.task.task_id, None)
                gone.append(claim)
            else:
                running[claim.task.task_id] = now
                ready.append(now)
        if not gone:
            return False
        freed = self._release(gone)
        if self._watching:
            self._changed.notify_all()  # room, or idle
        return freed

    def _wake_next(self) -> None:
        """Wake one waiting thread (lock held) when there is work it could take now and no
        thread woken before has looked yet: threads wake one after the other as they take
        claims, not all at once for a batch (a wake-up is a thread switch, and the GIL's)."""
        if self._wake_sent or not self._idle:
            return
        heap = self._heap
        if (
            self._ready
            or heap
            and (not self._starting or self._start is None or heap[0][0] == STARTED_FIRST)
        ):
            self._wake_sent = True
            self._work.notify()

    def _done(self, claim: Claim) -> bool:
        """A thread ran ``claim`` (lock held): count it gone and wake the fetcher if it waits
        for room or idleness. True when a limited queue got room, or a fair name's claim left
        (see ``_release``)."""
        task = claim.task
        self._running.pop(task.task_id, None)
        if (self.queue_limits and task.queue in self.queue_limits) or (
            self.fair_names and (self.wake_any or task.task_name in self.fair_names)
        ):  # _release([claim]) inline
            self.version += 1
            self._changed.notify_all()
            return True
        if not self._watching:
            return False
        # Idle (wait_idle), or _may_have_room() inline (once per task, usually false while
        # busy) then _room(). Not merely no thread running: one thread running the claims it
        # started for the others finds none besides its own, while the heap is full.
        if (
            not (self._running or self._heap)
            or (
                len(self._heap) <= self.queue_capacity // 2
                or self._async_heap
                or self._async_running
            )
            and self._room()
        ):
            self._changed.notify_all()
        return False

    def join(self, timeout: float) -> bool:
        """After ``close()``: wait for idle threads to exit; False if some are still busy."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._threads:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._wait_changed(remaining)
            return True
