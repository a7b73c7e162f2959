"""SQLite: the storage's writes in one process take turns on a fair lock per database file.

SQLite lets one writer in at a time. A writer that finds the write lock taken sleeps in
SQLite's busy handler, in steps of 1, 2, 5, 10 ms and longer, and tries again: when the worker's
own threads (claim rounds, starts, completions, heartbeats, chores) contend, each write that
waits sleeps past the moment the lock frees, often several times as long as the write it waited
for. Taking turns here instead, a thread hands the turn straight to the next one in line (first
come, first served: none is starved) the moment its write commits. Writes of other processes,
and of handlers outside the storage, still queue on SQLite's lock as before: a turn is taken
only around the storage's own writes, and never by a thread already inside a transaction, so a
thread waiting for its turn never holds the database's write lock (no deadlock).
"""

from __future__ import annotations

import collections
import threading
from types import TracebackType

_turns: dict[str, WriteTurns] = {}
_turns_lock = threading.Lock()


def for_file(name: str) -> WriteTurns:
    """The turns of the SQLite database ``name`` (its ``NAME`` setting) in this process."""
    with _turns_lock:
        turns = _turns.get(name)
        if turns is None:
            turns = _turns[name] = WriteTurns()
        return turns


class WriteTurns:
    """A re-entrant lock handed to its waiters in the order they came."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        self._waiting: collections.deque[tuple[int, threading.Lock]] = collections.deque()

    def held(self) -> bool:
        """Whether the calling thread has the turn."""
        return self._owner == threading.get_ident()

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._mutex:
            if self._owner == me:
                self._depth += 1
                return
            if self._owner is None:
                self._owner, self._depth = me, 1
                return
            handed = threading.Lock()
            handed.acquire()
            self._waiting.append((me, handed))
        try:
            handed.acquire()  # released by the thread that hands this one the turn
        except BaseException:
            # Interrupted while in line (KeyboardInterrupt in the main thread): leave the line,
            # or pass on a turn handed meanwhile, so that nobody waits for this thread.
            with self._mutex:
                if self._owner != me:
                    self._waiting.remove((me, handed))
                    raise
            self.__exit__(None, None, None)
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._mutex:
            self._depth -= 1
            if self._depth:
                return
            if self._waiting:
                self._owner, handed = self._waiting.popleft()
                self._depth = 1
                handed.release()
            else:
                self._owner = None
