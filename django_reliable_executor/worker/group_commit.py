"""Group commit: concurrent callers share one storage round trip instead of taking one each."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - item
O = TypeVar("O")  # noqa: E741 - outcome


class _Slot(Generic[I, O]):
    # Defaults on the class: a slot is made for every task, and sets only what changes.
    finished = False
    must_flush = False
    outcome: O | None = None
    error: BaseException | None = None

    def __init__(self, item: I) -> None:
        self.item = item
        # Each caller waits on its own queue: waking only the callers concerned (not every
        # waiter on a shared condition) matters with many threads on few cores. A SimpleQueue
        # is C code through and through, where an Event's wait and set are Python (a Condition
        # around a lock): this wait-and-wake comes once per task.
        self.wake: queue.SimpleQueue[None] = queue.SimpleQueue()


class GroupCommitter(Generic[I, O]):
    """Coalesce concurrent ``submit`` calls into batched ``flush`` calls.

    The first caller that finds no batch in flight takes the flushing turn: it flushes everything
    waiting (its own item included), hands each caller its outcome, and passes the turn to the
    oldest caller still waiting. A lone caller pays one round trip, as without batching; eight busy
    threads share one. Every caller still returns only after its own write is done, so the
    semantics of the underlying call are unchanged.

    When a batch of several fails and ``isolate(error)`` is true (the store refused the write,
    rather than being out of reach), each item is flushed again alone: only the caller whose own
    item the store refuses gets an error, the others their outcomes.
    """

    def __init__(
        self,
        flush: Callable[[list[I]], Sequence[O]],
        max_batch: int = 100,
        isolate: Callable[[BaseException], bool] | None = None,
    ) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._isolate = isolate
        self._lock = threading.Lock()
        self._waiting: list[_Slot[I, O]] = []
        self._turn_taken = False

    def submit(self, item: I) -> O:
        slot: _Slot[I, O] = _Slot(item)
        with self._lock:  # _enqueue([slot]), without its list: once per task
            self._waiting.append(slot)
            slot.must_flush = not self._turn_taken
            self._turn_taken = True
        self._await(slot)
        if slot.error is not None:
            raise slot.error
        return slot.outcome  # type: ignore[return-value]

    def submit_many(self, items: Sequence[I]) -> list[O | BaseException]:
        """``submit`` for several items of one caller, in as few batches as they fit: each
        item's outcome, or the error its write raised, in order."""
        slots: list[_Slot[I, O]] = [_Slot(item) for item in items]
        if slots:
            self._enqueue(slots)
        for slot in slots:
            self._await(slot)
        return [slot.outcome if slot.error is None else slot.error for slot in slots]  # type: ignore[misc]

    def _enqueue(self, slots: list[_Slot[I, O]]) -> None:
        with self._lock:
            self._waiting.extend(slots)
            slots[0].must_flush = not self._turn_taken
            self._turn_taken = True

    def _await(self, slot: _Slot[I, O]) -> None:
        """Wait until ``slot`` is written, taking the flushing turn whenever it passes to it."""
        while not slot.finished:
            if slot.must_flush:
                slot.must_flush = False
                self._take_turn(slot)
            else:
                slot.wake.get()  # a wake-up left over from a turn taken meanwhile is harmless

    def _take_turn(self, own: _Slot[I, O]) -> None:
        """Flush batches until our own item is written, then pass the turn to the oldest
        waiter: no thread is kept writing for others while its own work waits."""
        while True:
            with self._lock:
                batch = self._waiting[: self._max_batch]
                del self._waiting[: self._max_batch]
            if batch:
                self._run(batch)
            if own.finished or not batch:
                with self._lock:
                    if self._waiting:
                        successor = self._waiting[0]
                        successor.must_flush = True
                        successor.wake.put(None)
                    else:
                        self._turn_taken = False
                return

    def _run(self, batch: list[_Slot[I, O]]) -> None:
        try:
            self._write(batch)
        except BaseException as exc:  # every waiter learns of its failure
            if len(batch) > 1 and self._isolate is not None and self._isolate(exc):
                for slot in batch:
                    try:
                        self._write([slot])
                    except BaseException as alone:
                        slot.error = alone
            else:
                for slot in batch:
                    slot.error = exc
        for slot in batch:
            slot.finished = True
            slot.wake.put(None)

    def _write(self, batch: list[_Slot[I, O]]) -> None:
        outcomes = self._flush([slot.item for slot in batch])
        if len(outcomes) != len(batch):
            raise RuntimeError("flush returned a different number of outcomes")
        for slot, outcome in zip(batch, outcomes, strict=True):
            slot.outcome = outcome
