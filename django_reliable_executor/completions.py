"""CompletionWriter: records successful outcomes in the background, in batches, so a pool thread
can take its next task as soon as its handler returns."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

from .records import Claim, Transition

logger = logging.getLogger("django_reliable_executor")

MAX_BATCH = 200


class CompletionWriter:
    """One thread that writes every pending completion in one conditional UPDATE per batch,
    then announces them (signals, logs). Until written, a completed task stays RUNNING under its
    lease: if the worker dies first, the task is recovered and runs again — the at-least-once
    promise, never a lost task. ``close()`` writes whatever is still pending."""

    def __init__(
        self,
        write: Callable[[list[tuple[Claim, Any]]], list[Transition | None]],
        announce: Callable[[Transition], None],
        discarded: Callable[[Claim], None],
    ) -> None:
        self._write = write
        self._announce = announce
        self._discarded = discarded
        self._cond = threading.Condition()
        self._pending: list[tuple[Claim, Any]] = []
        self._writing: list[tuple[Claim, Any]] = []
        self._closed = False
        self._thread = threading.Thread(
            target=self._loop, name="reliable-executor-completions", daemon=True
        )
        self._thread.start()

    def put(self, claim: Claim, result: Any) -> None:
        with self._cond:
            self._pending.append((claim, result))
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
        try:
            while True:
                with self._cond:
                    while not self._pending and not self._closed:
                        self._cond.wait()
                    if not self._pending:
                        return
                    self._writing = self._pending[:MAX_BATCH]
                    del self._pending[:MAX_BATCH]
                    batch = self._writing
                try:
                    transitions = self._write(batch)
                except Exception:
                    # The tasks stay RUNNING; lease recovery runs them again.
                    logger.exception("could not record %d completions", len(batch))
                    connections.close_all()
                    transitions = []
                for (claim, _), transition in zip(batch, transitions, strict=False):
                    if transition is None:
                        self._discarded(claim)
                    else:
                        self._announce(transition)
                with self._cond:
                    self._writing = []
        finally:
            connections.close_all()
