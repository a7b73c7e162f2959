"""The time source every component reads, so tests can move time without sleeping."""

from __future__ import annotations

import datetime as dt
import threading
import time

UTC = dt.timezone.utc


class Clock:
    """Wall-clock time as aware UTC datetimes."""

    def now(self) -> dt.datetime:
        return dt.datetime.now(UTC)

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (a pause between rounds of work, such as a paced purge's)."""
        time.sleep(seconds)


class FakeClock(Clock):
    """A clock that only moves when told to (tests)."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2030, 1, 1, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> dt.datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> dt.datetime:
        with self._lock:
            self._now += dt.timedelta(seconds=seconds)
            return self._now

    def sleep(self, seconds: float) -> None:
        """Moves the time on instead of waiting."""
        self.advance(seconds)


system_clock = Clock()
