"""CompletionWriter: records successful outcomes in the background, in batches, so a pool thread
can take its next task as soon as its handler returns."""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from ..core.records import Claim, Transition
from ..core.serialization import RESULT_REFUSED, ConversionError, encode
from ..exceptions import storage_unavailable

logger = logging.getLogger("django_reliable_executor")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)

MAX_BATCH = 200
# While busy (completions came in as the last batch was written), the writer waits up to
# LINGER_SECONDS for LINGER_BATCH of them: fewer, larger writes, each costing the worker a
# script call or a statement and the announcing of its batch. An idle worker's lone
# completion is written at once.
LINGER_SECONDS = 0.002  # a completion is recorded at most this much later than without it
LINGER_BATCH = 32
RETRY_WAIT_MIN = 0.1  # seconds after the first failed write; doubles up to RETRY_WAIT_MAX
RETRY_WAIT_MAX = 5.0
CLOSING_RETRIES = 3


def hand_over(claim: Claim, value: Any, writer: Any) -> str | None:
    """Give a handler's return value to ``writer`` (a CompletionWriter, or anything with its
    ``put``); or, when no storage could take it, return the error to record instead (without a
    storage call: the caller records it)."""
    # Serialised here, once: a value no storage can take (not JSON, an integer too long to
    # write, nested too deeply) fails this task alone, never the batch it would join.
    # Not retried: the same handler returns the same kind of value again.
    try:
        result = encode(value)
    except ConversionError as exc:
        return f"{RESULT_REFUSED}: {exc}"
    except Exception as exc:  # a model_dump() that raises, say
        return f"{RESULT_REFUSED}: {type(exc).__name__}: {exc}"
    writer.put(claim, result)
    return None


class CompletionWriter:
    """One thread that writes every pending completion in one conditional UPDATE per batch,
    then announces them together (signals, logs, metrics). Until written, a completed task
    stays RUNNING under its lease: if the worker dies first, the task is recovered and runs
    again — the at-least-once promise, never a lost task. ``close()`` writes whatever is
    still pending.

    A batch the storage refuses (an error other than being out of reach) is written again item
    by item, and ``refuse(claim, error)`` records the failure of each task whose own write is
    refused: one result the storage cannot take never holds up the others."""

    def __init__(
        self,
        write: Callable[[list[tuple[Claim, Any]]], list[Transition | None]],
        announce: Callable[[list[Transition]], None],
        discarded: Callable[[Claim], None],
        written: Callable[[list[Claim]], None] | None = None,
        refuse: Callable[[Claim, Exception], Transition | None] | None = None,
    ) -> None:
        self._write = write
        self._refuse = refuse
        self._written = written  # told which claims it no longer holds (per-queue limits)
        self._announce = announce
        self._discarded = discarded
        self._lock = threading.Lock()  # a plain lock: put() takes it once per task
        self._cond = threading.Condition(self._lock)
        self._pending: list[tuple[Claim, Any]] = []
        self._writing: list[tuple[Claim, Any]] = []
        self._closed = False
        self._idle = False  # waiting for a first completion
        self._lingering = False  # waiting for LINGER_BATCH completions, or LINGER_SECONDS
        self._thread = threading.Thread(
            target=self._loop, name="reliable-executor-completions", daemon=True
        )
        self._thread.start()

    def put(self, claim: Claim, result: Any) -> None:
        with self._lock:
            pending = self._pending
            pending.append((claim, result))
            # A writing writer takes it with the next batch; a lingering one once enough wait.
            if self._idle or (self._lingering and len(pending) >= LINGER_BATCH):
                self._cond.notify()

    def held(self) -> list[Claim]:
        """Claims completed but not yet written: their leases still need renewing."""
        with self._cond:
            return [claim for claim, _ in self._pending + self._writing]

    def close(self, timeout: float = 30.0) -> None:
        """Write everything pending, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        failures = 0
        busy = False  # completions came in while the last batch was written
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closed:
                        self._idle = True
                        self._cond.wait()
                        self._idle = False
                    if busy and len(self._pending) < LINGER_BATCH and not self._closed:
                        self._lingering = True
                        self._cond.wait(LINGER_SECONDS)
                        self._lingering = False
                    if not self._pending:
                        return
                    self._writing = self._pending[:MAX_BATCH]
                    del self._pending[:MAX_BATCH]
                    batch = self._writing
                recorded, kept = self._record(batch)
                # Transitions are truthy: filter(None) keeps those recorded, in C.
                announced = list(filter(None, map(_SECOND, recorded)))
                if len(announced) < len(recorded):
                    for claim, transition in recorded:
                        if transition is None:
                            self._discarded(claim)
                if announced:
                    self._announce(announced)
                if kept:
                    failures += 1
                    if self._retry_later(kept, failures):
                        held = {id(item) for item in kept}
                        batch = [item for item in batch if id(item) not in held]
                    # else the tasks stay RUNNING; lease recovery runs them again.
                else:
                    failures = 0
                with self._cond:
                    self._writing = []
                    busy = bool(self._pending)
                if self._written is not None and batch:
                    try:
                        self._written([claim for claim, _ in batch])
                    except Exception:
                        logger.exception("completions written: callback failed")
        finally:
            connections.close_all()

    def _record(
        self, batch: list[tuple[Claim, Any]]
    ) -> tuple[list[tuple[Claim, Transition | None]], list[tuple[Claim, Any]]]:
        """Write the batch: returns what was recorded for each claim, and the items to keep
        and write again later because the storage could not be reached."""
        refuse = self._refuse
        try:
            transitions = self._write(batch)
            return list(zip(map(_FIRST, batch), transitions, strict=True)), []
        except Exception as exc:
            connections.close_all()
            if storage_unavailable(exc) or refuse is None:
                logger.exception("could not record %d completions", len(batch))
                return [], batch
            refusal = exc
            if len(batch) > 1:
                logger.warning(
                    "the storage refused a batch of %d completions (%s); writing them one by one",
                    len(batch),
                    exc,
                )
        recorded: list[tuple[Claim, Transition | None]] = []
        kept: list[tuple[Claim, Any]] = []
        for index, item in enumerate(batch):
            claim = item[0]
            if len(batch) > 1:
                try:
                    recorded.append((claim, self._write([item])[0]))
                    continue
                except Exception as exc:
                    if storage_unavailable(exc):
                        logger.exception("could not record %d completions", len(batch) - index)
                        return recorded, kept + batch[index:]
                    refusal = exc
            try:
                recorded.append((claim, refuse(claim, refusal)))
            except Exception as exc:
                logger.exception("task %s: could not record its refused result", claim.task_id)
                if storage_unavailable(exc):
                    return recorded, kept + batch[index:]
                kept.append(item)
        return recorded, kept

    def _retry_later(self, batch: list[tuple[Claim, Any]], failures: int) -> bool:
        """After a failed write (the storage is down): keep the items and wait, backing off up
        to RETRY_WAIT_MAX, so a short outage costs no re-run. Once closing, give up after a
        few tries: the leases then expire and the tasks run again elsewhere."""
        if self._closed and failures > CLOSING_RETRIES:
            logger.error("could not record %d completions; giving up", len(batch))
            return False
        wait = min(RETRY_WAIT_MIN * 2 ** (failures - 1), RETRY_WAIT_MAX)
        logger.warning("could not record %d completions; retrying in %.1fs", len(batch), wait)
        with self._cond:
            self._pending[:0] = batch
            self._writing = []
            self._cond.wait(wait)
        return True
