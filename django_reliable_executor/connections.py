"""Database connection hygiene for long-lived worker threads."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

T = TypeVar("T")

# Per thread, ``open`` is False once tidy_connections found no open connection and none was
# opened since (Django sends connection_created, in the connecting thread, for each one): a
# pool thread whose handlers never touch the database then skips the look at every alias.
_threads = threading.local()


def _opened(sender: Any, connection: Any, **kwargs: Any) -> None:
    _threads.open = True


connection_created.connect(_opened, weak=False, dispatch_uid="reliable-executor-opened")


def tidy_connections() -> None:
    """Between tasks: close broken connections and ones past a positive CONN_MAX_AGE, but keep
    healthy ones open even with CONN_MAX_AGE = 0 — that default is meant for web requests, and
    reconnecting before every task would cost more than most tasks do."""
    if not getattr(_threads, "open", True):
        return
    found = False
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        found = True
        if conn.in_atomic_block:
            # A handler left a transaction open: never let it leak into the next task.
            conn.close()
        elif conn.settings_dict.get("CONN_MAX_AGE") != 0:
            conn.close_if_unusable_or_obsolete()
        elif conn.errors_occurred:
            _close_if_unusable(conn)
    _threads.open = found


def close_connections() -> None:
    """Close this thread's database connections (a worker thread that ends)."""
    connections.close_all()


def drop_unusable_connections() -> int:
    """After a storage error in a long-lived thread: close this thread's database connections
    the error left unusable (killed by the server, a restart, a failover, a proxy or an idle
    timeout), so the thread's next call opens a fresh one instead of failing forever. Returns
    how many were closed: a caller may then retry its call at once. Connections of this thread
    only (Django's are per thread); one inside a transaction is left to that transaction's
    ``atomic`` block, which closes it itself when its rollback fails."""
    closed = 0
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.in_atomic_block or not conn.errors_occurred:
            continue
        closed += _close_if_unusable(conn)
    return closed


def with_reconnect(call: Callable[[], T]) -> T:
    """``call()``; when it fails on a connection the server killed, once more at once on a
    new connection. Only for calls that are safe to repeat (idempotent or fenced writes)."""
    try:
        return call()
    except Exception:
        if not drop_unusable_connections():
            raise
    return call()


def _close_if_unusable(conn: BaseDatabaseWrapper) -> bool:
    """Close ``conn`` when a ping fails (else forget its errors); True when it was closed."""
    if conn.is_usable():
        conn.errors_occurred = False
        return False
    # Closing a dead connection may fail; Django forgets it all the same.
    with contextlib.suppress(DatabaseError):
        conn.close()
    return True


def out_of_reach(exc: BaseException, alias: str | None) -> bool:
    """After ``exc`` from a storage call in this thread: was the storage out of reach (a
    connection the server ended, closed now so that the next call opens a new one; a server
    that does not answer yet) rather than refusing the write? ``alias``: the task database's,
    None for Redis (whose client raises its own connection errors)."""
    if drop_unusable_connections():
        return True
    if alias is None or not isinstance(exc, DatabaseError):
        from .exceptions import storage_unavailable

        return storage_unavailable(exc)
    # No connection left: the last attempt to open one failed (a server restarting).
    return isinstance(exc, (OperationalError, InterfaceError)) and (
        connections[alias].connection is None
    )
