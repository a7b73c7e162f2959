"""PoolState: what the bounded pool's threads, its fetcher and its event-loop side share, under
one lock (the local queues, what runs), and what the fetcher and shutdown ask of it: the room
to claim into, what is held, idleness."""

from __future__ import annotations

import heapq
import itertools
import logging
import operator
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping

from ..core.records import Claim

logger = logging.getLogger("django_reliable_executor")

_QUEUE = operator.attrgetter("task.queue")

# run_async(claims, done): run these claims' handlers; done(claim) once each has finished.
RunAsync = Callable[[list[Claim], Callable[[Claim], None]], None]


class PoolState:
    """The pool's shared state, its accounting (the ``_`` methods: lock held) and the
    fetcher's and shutdown's questions (the public ones). The threads' side (pool.py) and the
    event loop's side (pool_async.py) build on it."""

    def __init__(
        self,
        *,
        max_size: int,
        queue_capacity: int,
        queue_limits: Mapping[str, int] | None,
        on_freed: Callable[[], object] | None,
        fair_names: Collection[str] = (),
        async_capacity: int,
        run_async: RunAsync | None,
        is_async: Callable[[Claim], bool] | None,
    ) -> None:
        self.max_size = max_size
        self.queue_capacity = queue_capacity
        # Per-queue limits (absent: unlimited). The fetcher claims no more of a queue than its
        # limit minus what is held of it here (counted when it asks, not at every task).
        self.queue_limits = dict(queue_limits or {})
        # The names with fairness: claimed only for idle threads (fetcher.py), so one of them
        # leaving frees a thread the fetcher may be waiting for, as a limited queue's slot.
        self.fair_names = frozenset(fair_names)
        # Set by the fetcher while it waits with fair names to claim: then any claim leaving
        # frees a thread their next turn may be claimed for (not only a fair one's).
        self.wake_any = False
        # Bumped whenever a claim of a limited queue leaves the pool; on_freed then runs
        # (outside the lock) so a fetcher blocked elsewhere can be woken.
        self.version = 0
        self._on_freed = on_freed
        # One lock, three conditions: pool threads wait on _work for claims; the fetcher and
        # shutdown wait on _changed for room or idleness; the event loop's feeder on
        # _async_work. Waking only the side concerned matters: a wake-up per finished task
        # costs a thread switch on a busy worker.
        self._cond = threading.Lock()
        self._work = threading.Condition(self._cond)
        self._changed = threading.Condition(self._cond)
        self._async_work = threading.Condition(self._cond)
        self._watching = 0  # threads waiting on _changed: a finished task notifies only them
        self._closed = False
        # The threads' claims: waiting (a heap in priority order), and taken by a thread
        # (starting, ready or running).
        self._heap: list[tuple[int, int, Claim]] = []
        self._order = itertools.count()
        self._running: dict[str, Claim] = {}
        # Async claims: waiting for a slot on the event loop, and handed to it (running).
        self._run_async = run_async
        self._is_async = is_async
        self.async_capacity = async_capacity if run_async is not None and is_async else 0
        self._async_heap: list[tuple[int, int, Claim]] = []
        self._async_running: dict[str, Claim] = {}

    def _release(self, claims: list[Claim]) -> bool:
        """Claims left the pool (lock held); True when one of a limited queue did, which gave
        it room (the fetcher's waits on ``_changed`` are then woken)."""
        limits, fair = self.queue_limits, self.fair_names
        freed = (bool(limits) and any(queue in limits for queue in map(_QUEUE, claims))) or (
            bool(fair)
            and bool(claims)
            and (self.wake_any or any(claim.task.task_name in fair for claim in claims))
        )
        if freed:
            self.version += 1
            self._changed.notify_all()
        return freed

    def _notify_freed(self, freed: bool) -> None:
        if freed and self._on_freed is not None:
            try:
                self._on_freed()
            except Exception:
                logger.exception("could not wake the claim loop")

    def _thread_free(self) -> int:
        """Below zero when claims taken for async slots turned out to be for threads."""
        return self.max_size + self.queue_capacity - len(self._heap) - len(self._running)

    def _free(self) -> int:
        return max(0, self._thread_free() + self._async_free())

    def _may_have_room(self) -> bool:
        """False when ``_room()`` is 0 for sure: the threads' queue is still over half full and
        no async slot is held (the usual case of a busy worker, checked for every task)."""
        return (
            len(self._heap) <= self.queue_capacity // 2
            or bool(self._async_heap)
            or bool(self._async_running)
        )

    def _room(self) -> int:
        if not self._may_have_room():
            return 0
        thread_free, async_free = self._thread_free(), self._async_free()
        threads = thread_free if len(self._heap) <= self.queue_capacity // 2 else 0
        return min(max(0, thread_free + async_free), max(threads, 0) + max(async_free, 0))

    def _idle_now(self) -> bool:
        return not (self._heap or self._running or self._async_heap or self._async_running)

    def _wait_changed(self, timeout: float | None) -> None:
        """Wait on ``_changed`` (lock held), counted in ``_watching``."""
        self._watching += 1
        try:
            self._changed.wait(timeout)
        finally:
            self._watching -= 1

    def _async_free(self) -> int:
        """Free async slots, counted only while async claims are held: a worker whose tasks
        are all synchronous claims exactly as without an event loop. Below zero when claims
        taken for threads turned out to be async."""
        if not (self._async_heap or self._async_running):
            return 0
        return self.async_capacity - len(self._async_heap) - len(self._async_running)

    def free_slots(self) -> int:
        """How many more claims the pool can take: max threads + queue capacity - held, plus
        the free async slots while async claims are held."""
        with self._cond:
            return self._free()

    def room(self) -> int:
        """Claims worth asking for now: the free slots once the local queue has drained to half
        its capacity, else 0. Refilling in batches keeps claims to one round trip per many
        tasks instead of one per finished task."""
        with self._cond:
            return self._room()

    def wait_for_room(self, timeout: float) -> None:
        """Block until ``room()`` is positive (a claim finished), or ``timeout``."""
        with self._cond:
            if not self._room():
                self._wait_changed(timeout)

    def held_by_queue(self) -> dict[str, int]:
        """Claims queued or running here, per queue."""
        with self._cond:
            held = [item[2] for heap in (self._heap, self._async_heap) for item in heap]
            held += [*self._running.values(), *self._async_running.values()]
            return dict(Counter(map(_QUEUE, held)))

    def wait_for_change(self, version: int, timeout: float) -> None:
        """Block until a claim of a limited queue left the pool since ``version``, or
        ``timeout``."""
        with self._cond:
            if self.version == version:
                self._wait_changed(timeout)

    def freed_elsewhere(self, claims: list[Claim]) -> None:
        """Claims held outside the pool (completions being written) are gone: when one is of a
        limited queue, wake the fetcher as if it had left the pool."""
        if not any(claim.task.queue in self.queue_limits for claim in claims):
            return
        with self._cond:
            self.version += 1
            self._changed.notify_all()
        self._notify_freed(True)

    def take_queued(self) -> list[Claim]:
        """Remove and return every claim not yet started (shutdown: hand them back). Claims
        the storage started as it claimed them stay, and the threads run them."""
        with self._cond:
            unstarted = []
            for heap in (self._heap, self._async_heap):
                unstarted += [item for item in heap if not item[2].is_started]
                heap[:] = [item for item in heap if item[2].is_started]
                heapq.heapify(heap)
            claims = [item[2] for item in sorted(unstarted)]  # by priority, then claim order
            self._release(claims)
            return claims

    def drop(self, task_ids: set[str]) -> list[Claim]:
        """Remove queued claims whose lease was lost, so they are never started here."""
        with self._cond:
            dropped = []
            for heap in (self._heap, self._async_heap):
                gone = [item for item in heap if item[2].task_id in task_ids]
                if gone:
                    heap[:] = [item for item in heap if item[2].task_id not in task_ids]
                    heapq.heapify(heap)
                    dropped += [item[2] for item in gone]
            freed = self._release(dropped) if dropped else False
        self._notify_freed(freed)
        return dropped

    def held(self) -> list[Claim]:
        """Every claim queued or running here (for the heartbeat)."""
        with self._cond:
            return [item[2] for heap in (self._heap, self._async_heap) for item in heap] + [
                *self._running.values(),
                *self._async_running.values(),
            ]

    def running_ids(self) -> set[str]:
        with self._cond:
            return set(self._running) | set(self._async_running)

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._heap) + len(self._async_heap)

    def is_idle(self) -> bool:
        with self._cond:
            return self._idle_now()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until nothing is queued or running; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._idle_now():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._wait_changed(remaining if remaining is None else min(remaining, 0.5))
            return True
