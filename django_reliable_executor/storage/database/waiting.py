"""Waking idle workers on the database storage: LISTEN/NOTIFY, a marker file, or short polls.

Each database has its own way for a commit to reach an idle worker (docs/storage-layouts.md,
Waking idle workers):

- PostgreSQL: the submitting transaction calls ``pg_notify`` (delivered on commit only, once
  per transaction, channel and queue); the worker LISTENs on a dedicated connection and waits
  on its socket.
- SQLite: every client is on the database's host, so a committed submit touches a marker file
  beside the database (``<NAME>-executor-wake``) and idle workers watch its mtime: no queries.
- MariaDB/MySQL: nothing a server offers wakes a waiter on another connection's commit, so an
  idle worker waits a short time after recent work (a fraction of how long it has been idle)
  and asks once per POLL_INTERVAL once idle for long.

In every case the wait ends after ``timeout`` (POLL_INTERVAL) at the latest: the worker's claim
then is the fallback for a lost notification, a dropped LISTEN connection or a submitter that
sends none. ``wake()`` (stop, a freed slot) ends any wait of this process through a socket
pair.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Collection, Iterable
from typing import Any

from django.db import connections

logger = logging.getLogger("django_reliable_executor")

MIN_WAIT = 0.005  # shortest wait between two claims of an idle worker
# Polling only: an idle worker waits up to this fraction of the time since its last claim that
# found work (at least MIN_WAIT, at most POLL_INTERVAL): the claims after a burst add up to at
# most (1 + ln(POLL_INTERVAL / MIN_WAIT)) / IDLE_FRACTION (315 at the defaults), then the worker
# asks once per POLL_INTERVAL (from POLL_INTERVAL / IDLE_FRACTION after its last task on).
IDLE_FRACTION = 0.02
MARKER_CHECK_SECONDS = 0.005  # how often an idle SQLite worker looks at the marker file
MARKER_SUFFIX = "-executor-wake"
CONNECTION_OK = 0  # libpq's ConnStatusType CONNECTION_OK (psycopg.pq.ConnStatus.OK)
# The LISTEN connection: notice a silently dead server within about a minute (libpq's default
# keepalive waits two hours), and never hang the claim loop on a connect for long.
LISTEN_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
    "connect_timeout": 2,  # libpq honours no less
}


def channel_sql(table: str) -> str:
    """SQL for the NOTIFY channel of the task table ``table`` (unquoted name): the name and
    the table's OID, so that task tables of two schemas of one database never share a channel
    (notifications never cross databases). Computed by the server, on both sides alike."""
    return f"'{table}_' || CAST(CAST('\"{table}\"' AS regclass) AS oid)"


class Waiter:
    """One thread's wait for work: a socket pair, which ``ring`` writes to, ends it at once."""

    def __init__(self, wakeups: Wakeups) -> None:
        self.wakeups = wakeups
        # A socket pair rather than a pipe: selectable on every platform.
        self._inbox, self._bell = socket.socketpair()
        self._inbox.setblocking(False)
        self._bell.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._inbox, selectors.EVENT_READ)

    def wait(self, queues: Collection[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when work may have arrived."""
        return self._sleep(self._polling_wait(timeout))

    def _polling_wait(self, timeout: float) -> float:
        """How long to wait before the next claim when nothing signals new work."""
        found = self.wakeups.found_at
        if found is None:
            return timeout
        return min(timeout, max(MIN_WAIT, (time.monotonic() - found) * IDLE_FRACTION))

    def _sleep(self, timeout: float) -> bool:
        """Wait until rung, another registered file is readable, or ``timeout`` passed: True
        when rung."""
        events = self._selector.select(max(timeout, 0))
        if any(key.fileobj is self._inbox for key, _ in events):
            try:
                while self._inbox.recv(512):
                    pass
            except (BlockingIOError, OSError):
                pass
            return True
        return False

    def ring(self) -> None:
        # A full buffer: rung already. Closed: that wait is over anyway.
        with contextlib.suppress(OSError):
            self._bell.send(b"\0")

    def close(self) -> None:
        self._selector.close()
        self._inbox.close()
        self._bell.close()


class MarkerWaiter(Waiter):
    """SQLite: wake when the marker file beside the database changes (a committed submit)."""

    def __init__(self, wakeups: Wakeups, path: str) -> None:
        super().__init__(wakeups)
        self.path = path
        self._seen = marker_state(path)
        self._fresh = True

    def wait(self, queues: Collection[str], timeout: float) -> bool:
        if self._fresh:
            # A submit between the last claim and the first look at the marker went unseen.
            self._fresh = False
            return True
        deadline = time.monotonic() + timeout
        while True:
            state = marker_state(self.path)
            if state != self._seen:
                self._seen = state
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._sleep(min(MARKER_CHECK_SECONDS, remaining)):
                return True


class NotifyWaiter(Waiter):
    """PostgreSQL: LISTEN on a connection of its own and wait on its socket. Without one (the
    server unreachable, psycopg2) it polls like MariaDB, trying to LISTEN again each
    POLL_INTERVAL."""

    def __init__(self, wakeups: Wakeups) -> None:
        super().__init__(wakeups)
        self._connection: Any = None
        self._retry_at = 0.0

    def wait(self, queues: Collection[str], timeout: float) -> bool:
        if self._connection is None:
            if time.monotonic() < self._retry_at or not self._listen():
                return self._sleep(self._polling_wait(timeout))
            # A submit between the last claim and this LISTEN reached nobody: look now.
            return True
        pgconn = self._connection.pgconn
        deadline = time.monotonic() + timeout
        while True:
            if self._sleep(deadline - time.monotonic()):
                return True
            try:
                # Read what arrived (nothing when the wait timed out): a dead connection
                # raises here, or reports itself as bad.
                pgconn.consume_input()
                if pgconn.status != CONNECTION_OK:
                    raise OSError("the server closed the LISTEN connection")
                hit = False
                while (note := pgconn.notifies()) is not None:
                    hit = hit or note.extra.decode() in queues
            except Exception as exc:
                logger.warning("lost the LISTEN connection (%s); polling until it is back", exc)
                self._drop()
                return True  # the claim that follows is the poll this wait stands for
            if hit:
                return True
            if time.monotonic() >= deadline:
                return False

    def _listen(self) -> bool:
        """Open the LISTEN connection; False (trying again a POLL_INTERVAL later) on failure."""
        self._retry_at = time.monotonic() + self.wakeups.retry_seconds
        try:
            import psycopg
        except ImportError:
            return False  # psycopg2: the worker polls (the submitters still notify)
        connection = None
        try:
            connection = psycopg.connect(**listen_params(self.wakeups.alias), autocommit=True)
            row: Any = connection.execute(f"SELECT {self.wakeups.channel}").fetchone()
            connection.execute(f'LISTEN "{row[0]}"')
            self._selector.register(connection.pgconn.socket, selectors.EVENT_READ)
        except Exception as exc:
            logger.warning("cannot LISTEN for new tasks (%s); polling meanwhile", exc)
            if connection is not None:
                connection.close()
            return False
        self._connection = connection
        return True

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        self._retry_at = 0.0  # try again at the next wait
        if connection is None:
            return
        for key in list(self._selector.get_map().values()):
            if key.fileobj is not self._inbox:
                self._selector.unregister(key.fileobj)
        with contextlib.suppress(Exception):
            connection.close()

    def close(self) -> None:
        self._drop()
        super().close()


def listen_params(alias: str) -> dict[str, Any]:
    """Connection parameters for a LISTEN connection to the database of ``alias``."""
    params = dict(connections[alias].get_connection_params())
    for key in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(key, None)  # Django's adaptations: this connection runs no queries of ours
    for key, value in LISTEN_OPTIONS.items():
        params.setdefault(key, value)
    return params


def marker_state(path: str) -> tuple[int, int, int] | None:
    """What changes when the marker file is touched (None while it does not exist)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return (stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)


class Wakeups:
    """The wake-ups of one database storage: the waiters of this process's waiting threads,
    and what a commit of new work does to reach the others (see the module docstring)."""

    def __init__(self, alias: str, vendor: str, table: str) -> None:
        self.alias = alias
        self.vendor = vendor
        #: SQL giving the PostgreSQL NOTIFY channel (see channel_sql).
        self.channel = channel_sql(table)
        self.retry_seconds = 1.0  # set to POLL_INTERVAL by the first wait
        #: time.monotonic() of the last claim that found work (polling waits grow from it).
        self.found_at: float | None = None
        self._local = threading.local()
        self._waiters: set[Waiter] = set()
        self._lock = threading.Lock()
        self._marker_failed = False

    def wait(self, queues: Collection[str], timeout: float) -> bool:
        self.retry_seconds = timeout
        waiter: Waiter | None = getattr(self._local, "waiter", None)
        if waiter is None:
            waiter = self._local.waiter = self._new_waiter()
            with self._lock:
                self._waiters.add(waiter)
        return waiter.wait(queues, timeout)

    @property
    def marker(self) -> str | None:
        """SQLite: the marker file's path (None for an in-memory database, and elsewhere).
        Looked up each time: tests point the alias at another file after start-up."""
        if self.vendor != "sqlite":
            return None
        connection: Any = connections[self.alias]
        if connection.is_in_memory_db():
            return None
        return os.fspath(connection.settings_dict["NAME"]) + MARKER_SUFFIX

    def _new_waiter(self) -> Waiter:
        if self.vendor == "postgresql":
            return NotifyWaiter(self)
        marker = self.marker
        if marker is not None:
            return MarkerWaiter(self, marker)
        return Waiter(self)

    def wake(self) -> None:
        """End the waits of every waiting thread of this process."""
        with self._lock:
            waiters = list(self._waiters)
        for waiter in waiters:
            waiter.ring()

    def stop_waiting(self) -> None:
        """Close the calling thread's waiter (its LISTEN connection, its pipe)."""
        waiter = getattr(self._local, "waiter", None)
        if waiter is None:
            return
        self._local.waiter = None
        with self._lock:
            self._waiters.discard(waiter)
        try:
            waiter.close()
        except Exception:
            logger.exception("could not close the wait for work")

    def committed(self) -> None:
        """New work was committed (on_commit of a submit or retry), on SQLite and MariaDB:
        touch the marker file (SQLite) and wake this process's idle waiters."""
        marker = self.marker
        if marker is not None and not self._marker_failed:
            touch(marker, self._marker_unusable)
        if self._waiters:
            self.wake()

    def _marker_unusable(self, error: OSError) -> None:
        self._marker_failed = True
        logger.warning(
            "cannot touch %s (%s): idle workers see new tasks within POLL_INTERVAL",
            error.filename,
            error,
        )


def touch(path: str, failed: Any) -> None:
    """Set the marker's mtime to now, creating it if needed; ``failed(error)`` on an error."""
    now = time.time_ns()
    try:
        try:
            os.utime(path, ns=(now, now))
        except FileNotFoundError:
            with open(path, "a"):
                pass
            os.utime(path, ns=(now, now))
    except OSError as error:
        failed(error)


def due_queues(pairs: Iterable[tuple[str, bool]]) -> list[str]:
    """The distinct queues of the ``(queue, due_now)`` pairs that are due now, in order."""
    return list(dict.fromkeys(queue for queue, due in pairs if due))
