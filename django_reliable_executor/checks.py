"""Django system checks: RELIABLE_EXECUTOR values are valid and point at configured services."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.db import connections

from .conf import SETTING_NAME, validate


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, SETTING_NAME, None)
    errors: list[CheckMessage] = [
        Error(message, hint="See docs/settings.md.", obj=key, id="reliable_executor.E001")
        for key, message in validate(raw)
    ]
    if errors:
        return errors
    raw = raw or {}
    storage = raw.get("STORAGE", "database")
    alias = raw.get("DATABASE_ALIAS", "default")
    if storage == "database" and alias not in settings.DATABASES:
        errors.append(
            Error(
                f"{SETTING_NAME}['DATABASE_ALIAS'] = {alias!r} is not a key of DATABASES",
                obj="DATABASE_ALIAS",
                id="reliable_executor.E002",
            )
        )
    if storage == "redis":
        errors.append(
            Error(
                f"{SETTING_NAME}['STORAGE'] = 'redis' is not available in this version yet",
                hint="Use 'database' (the default).",
                obj="STORAGE",
                id="reliable_executor.E005",
            )
        )
    if storage == "database" and not settings.USE_TZ:
        errors.append(
            Error(
                "the database storage needs USE_TZ = True: task times are aware UTC datetimes",
                obj="USE_TZ",
                id="reliable_executor.E004",
            )
        )
    cache_alias = raw.get("REDIS_CACHE_ALIAS")
    if storage == "redis" and cache_alias and cache_alias not in getattr(settings, "CACHES", {}):
        errors.append(
            Error(
                f"{SETTING_NAME}['REDIS_CACHE_ALIAS'] = {cache_alias!r} is not a key of CACHES",
                obj="REDIS_CACHE_ALIAS",
                id="reliable_executor.E003",
            )
        )
    return errors


# The claim statement on SQLite is UPDATE ... RETURNING, which SQLite has had since 3.35.
MIN_SQLITE = (3, 35, 0)


@register(Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """With --database (or, on Django 6, before commands): the task database answers and can
    run the claim statement."""
    raw = getattr(settings, SETTING_NAME, None) or {}
    if validate(raw) or raw.get("STORAGE", "database") != "database":
        return []
    alias = raw.get("DATABASE_ALIAS", "default")
    if not databases or alias not in databases or alias not in settings.DATABASES:
        return []
    connection = connections[alias]
    try:
        connection.ensure_connection()
    except Exception as exc:
        return [
            Error(
                f"the task database {alias!r} cannot be reached: {exc}",
                obj="DATABASE_ALIAS",
                id="reliable_executor.E006",
            )
        ]
    if connection.vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < MIN_SQLITE:
            return [
                Error(
                    f"SQLite {sqlite3.sqlite_version} is too old for the task table: "
                    "3.35 or newer is needed (UPDATE ... RETURNING)",
                    obj="DATABASE_ALIAS",
                    id="reliable_executor.E007",
                )
            ]
    return []
