"""The bounded pool's event-loop side: claims of ``async def`` handlers take no thread.

With an ``async_capacity``, they go to their own local queue, from which a feeder thread hands
up to that many at a time to the worker's event loop (``run_async``). While it holds any, the
pool has room for ``async_capacity`` more claims besides the threads' share, so claiming is not
bounded by ``max_size`` for them.
"""

from __future__ import annotations

import heapq
import logging
import operator

from django.db import connections

from ..core.records import Claim
from .pool_state import PoolState

logger = logging.getLogger("django_reliable_executor")

_TASK_NAME = operator.attrgetter("task.task_name")


class EventLoopSide(PoolState):
    """BoundedPool's async claims: handed to the event loop by a feeder thread."""

    def async_running_ids(self) -> set[str]:
        """The running tasks that are on the event loop (not in a pool thread)."""
        with self._cond:
            return set(self._async_running)

    def _to_event_loop_many(self, claims: list[Claim]) -> list[bool]:
        """``_to_event_loop`` of each claim, asked once per task name of the batch (the answer
        depends on the name's handler only; a batch mostly holds few names)."""
        if not self.async_capacity or self._is_async is None:
            return [False] * len(claims)
        names = list(map(_TASK_NAME, claims))
        one_of_each = dict(zip(names, claims, strict=True))
        verdicts = {name: self._to_event_loop(claim) for name, claim in one_of_each.items()}
        return list(map(verdicts.__getitem__, names))

    def _to_event_loop(self, claim: Claim) -> bool:
        if not self.async_capacity or self._is_async is None:
            return False
        try:
            return self._is_async(claim)
        except Exception:  # a thread then runs it, and records what fails
            logger.exception("task %s: could not look its handler up", claim.task_id)
            return False

    def _feed(self) -> None:
        """The feeder thread: hands waiting async claims to the event loop, by priority, as
        long as it has free slots; the loop's run_async starts them in one batched write."""
        while True:
            batch = self._next_async_batch()
            if not batch:  # closed
                connections.close_all()  # this thread's connections die with it
                return
            assert self._run_async is not None
            try:
                self._run_async(batch, self._async_done)
            except Exception:  # run_async does not raise; should it, the leases lapse
                logger.exception("could not hand %d claims to the event loop", len(batch))
                for claim in batch:
                    self._async_done(claim)

    def _next_async_batch(self) -> list[Claim]:
        """Wait for waiting async claims and free slots; take as many as fit, counted as
        running. Empty once the pool is closed and none wait."""
        with self._cond:
            while not self._async_heap or len(self._async_running) >= self.async_capacity:
                if self._closed and not self._async_heap:
                    return []
                self._async_work.wait(1.0)
            take = min(self.async_capacity - len(self._async_running), len(self._async_heap))
            batch = [heapq.heappop(self._async_heap)[2] for _ in range(take)]
            for claim in batch:
                self._async_running[claim.task_id] = claim
            return batch

    def _async_done(self, claim: Claim) -> None:
        """An async claim left the event loop (its outcome recorded or handed over)."""
        with self._cond:
            if self._async_running.pop(claim.task_id, None) is None:
                return
            freed = self._release([claim])
            self._async_work.notify()
            if self._watching and (self._room() or self._idle_now()):
                self._changed.notify_all()
        self._notify_freed(freed)
