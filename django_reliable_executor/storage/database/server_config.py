"""What is wrong with a database server's configuration for the task table (worker start)."""

from __future__ import annotations

from django.db import connections

from ...models import ReliableTask

# The docs page and section of the fix, named as the system checks' hints name them.
OPERATIONS_DOC = "docs/operations.md, Database and Redis care"


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


def mysql_warnings(alias: str) -> list[str]:
    """Columns of the task table not in utf8mb4 (a database created as utf8/utf8mb3): a
    4-byte character (an emoji, say) in a parameter, a result, a handler's error or progress
    message cannot be stored there, so a failure holding one is not recorded: the task runs
    again once its lease lapses. The id columns are utf8mb4 whatever the database's default
    (migration 0002); the others take the table's."""
    table = ReliableTask._meta.db_table
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, COLUMN_TYPE, CHARACTER_SET_NAME FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s"
            " AND CHARACTER_SET_NAME IS NOT NULL AND CHARACTER_SET_NAME <> 'utf8mb4'"
            " ORDER BY ORDINAL_POSITION",
            [table],
        )
        narrow = cursor.fetchall()
    if not narrow:
        return []
    columns = ", ".join(f"{name} ({kind}, {charset})" for name, kind, charset in narrow)
    return [
        f"{table} has columns not in utf8mb4: {columns}. A 4-byte character (an emoji, say) "
        "in a parameter, a result, a handler's error or progress message cannot be stored "
        "in them: a failure holding one is not recorded and the task runs again once its "
        f"lease lapses. Convert each: ALTER TABLE {table} MODIFY <column> <its type> "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin, keeping its NULL and CHECK "
        f"(see {OPERATIONS_DOC})."
    ]
