"""What is wrong with a database server's configuration for the task table (worker start)."""

from __future__ import annotations

from django.db import connections

from ...models import ReliableTask

OPERATIONS_DOC = "docs/operations.md, 'Database and Redis care'"


def postgresql_warnings(alias: str) -> list[str]:
    """Autovacuum off, for the server or the task table: its dead row versions (three or four
    per task) are then never reclaimed, and the table and the claim's time grow without end."""
    table = ReliableTask._meta.db_table
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('autovacuum'), current_setting('track_counts'),"
            " (SELECT reloptions FROM pg_class WHERE oid = to_regclass(%s))",
            [table],
        )
        autovacuum, track_counts, reloptions = cursor.fetchone()
    off = ("off", "false", "no", "0")
    warnings = [
        f"PostgreSQL runs with {setting} = off: nothing vacuums {table}, whose dead row "
        "versions then pile up (several per task) and slow every claim. Turn it on, or "
        f"VACUUM {table} yourself every minute or so under load (see {OPERATIONS_DOC})."
        for setting, value in (("autovacuum", autovacuum), ("track_counts", track_counts))
        if value in off
    ]
    options = dict(option.split("=", 1) for option in reloptions or [])
    if options.get("autovacuum_enabled", "on").lower() in off:
        warnings.append(
            f"{table} has autovacuum_enabled = off: its dead row versions pile up (several "
            f"per task) and slow every claim. Reset it with ALTER TABLE {table} RESET "
            f"(autovacuum_enabled), or VACUUM it yourself (see {OPERATIONS_DOC})."
        )
    return warnings
