"""Whether the task database has this app's tables: its migrations not applied there, and the
command that applies them (runexecutor refuses to start without them; health and status say
so instead of "does not answer")."""

from __future__ import annotations

from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from django_reliable_executor.storage import TaskStorage

APP_LABEL = "django_reliable_executor"


def unapplied_migrations(alias: str | None) -> list[str]:
    """This app's migrations not applied on database ``alias`` (``app.name``, in order);
    empty without one (Redis), and when the database cannot be read (its own error comes
    elsewhere)."""
    if alias is None:
        return []
    try:
        executor = MigrationExecutor(connections[alias])
        targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == APP_LABEL]
        plan = executor.migration_plan(targets)
    except DatabaseError:
        return []
    return [
        f"{migration.app_label}.{migration.name}" for migration, backwards in plan if not backwards
    ]


def migrate_command(alias: str) -> str:
    return "python manage.py migrate" + ("" if alias == "default" else f" --database {alias}")


def tables_missing(storage: TaskStorage) -> str | None:
    """One line for a task database without this app's tables (or with some missing), or
    None: "tables missing: run python manage.py migrate (unapplied: ...)"."""
    alias = storage.transaction_alias
    unapplied = unapplied_migrations(alias)
    if alias is None or not unapplied:
        return None
    shown = ", ".join(unapplied[:3]) + (
        f" and {len(unapplied) - 3} more" if len(unapplied) > 3 else ""
    )
    return (
        f"tables missing on database {alias!r}: run {migrate_command(alias)} (unapplied: {shown})"
    )
