"""Database connection hygiene for long-lived worker threads."""

from __future__ import annotations

from django.db import connections


def tidy_connections() -> None:
    """Between tasks: close broken connections and ones past a positive CONN_MAX_AGE, but keep
    healthy ones open even with CONN_MAX_AGE = 0 — that default is meant for web requests, and
    reconnecting before every task would cost more than most tasks do."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        if conn.in_atomic_block:
            # A handler left a transaction open: never let it leak into the next task.
            conn.close()
        elif conn.settings_dict.get("CONN_MAX_AGE") != 0:
            conn.close_if_unusable_or_obsolete()
        elif conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()
