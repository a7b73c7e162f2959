"""Group commit: concurrent callers share one storage round trip instead of taking one each."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - item
O = TypeVar("O")  # noqa: E741 - outcome


class _Slot(Generic[I, O]):
    __slots__ = ("item", "done", "outcome", "error")

    def __init__(self, item: I) -> None:
        self.item = item
        self.done = False
        self.outcome: O | None = None
        self.error: BaseException | None = None


class GroupCommitter(Generic[I, O]):
    """Coalesce concurrent ``submit`` calls into batched ``flush`` calls.

    The first caller that finds no batch in flight becomes the leader: it flushes everything
    waiting (its own item included), hands each caller its outcome, and repeats while more
    arrived meanwhile. A lone caller pays one round trip, as without batching; eight busy
    threads share one. Every caller still returns only after its own write is done, so the
    semantics of the underlying call are unchanged.
    """

    def __init__(self, flush: Callable[[list[I]], Sequence[O]], max_batch: int = 100) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._cond = threading.Condition()
        self._waiting: list[_Slot[I, O]] = []
        self._leader_active = False

    def submit(self, item: I) -> O:
        slot: _Slot[I, O] = _Slot(item)
        with self._cond:
            self._waiting.append(slot)
            while not slot.done and self._leader_active:
                self._cond.wait()
            if slot.done:
                return self._result(slot)
            self._leader_active = True
        try:
            while True:
                with self._cond:
                    batch = self._waiting[: self._max_batch]
                    del self._waiting[: self._max_batch]
                    if not batch:
                        break
                self._run(batch)
                if slot.done:
                    # Our item is written; let a waiter lead the rest so we can return.
                    break
        finally:
            with self._cond:
                self._leader_active = False
                self._cond.notify_all()
        return self._result(slot)

    def _run(self, batch: list[_Slot[I, O]]) -> None:
        try:
            outcomes = self._flush([slot.item for slot in batch])
            if len(outcomes) != len(batch):
                raise RuntimeError("flush returned a different number of outcomes")
            for slot, outcome in zip(batch, outcomes, strict=True):
                slot.outcome = outcome
        except BaseException as exc:  # every waiter learns of the failure
            for slot in batch:
                slot.error = exc
        with self._cond:
            for slot in batch:
                slot.done = True
            self._cond.notify_all()

    @staticmethod
    def _result(slot: _Slot[I, O]) -> O:
        if slot.error is not None:
            raise slot.error
        return slot.outcome  # type: ignore[return-value]
