"""Django system checks: RELIABLE_EXECUTOR values are valid and point at configured services."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.db import connections
from django.utils.module_loading import import_string

from .conf import SETTING_NAME, get_settings, validate


def see(page: str, section: str) -> str:
    """A hint naming the docs page and section that explain the fix: the project has no
    public documentation URL, so hints name the page of docs/ (also the site's path)."""
    return f"See docs/{page}, {section}."


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, SETTING_NAME, None)
    errors: list[CheckMessage] = [
        Error(message, hint=see("settings.md", "Every key"), obj=key, id="reliable_executor.E001")
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
                hint=see("settings.md", "Every key"),
                obj="DATABASE_ALIAS",
                id="reliable_executor.E002",
            )
        )
    if storage == "redis" and not redis_installed():
        errors.append(
            Error(
                f"{SETTING_NAME}['STORAGE'] = 'redis' but the redis package is not installed",
                hint="pip install django-reliable-executor[redis]",
                obj="STORAGE",
                id="reliable_executor.E005",
            )
        )
    if storage == "database" and not settings.USE_TZ:
        errors.append(
            Error(
                "the database storage needs USE_TZ = True: task times are aware UTC datetimes",
                hint=see("getting-started/install.md", "Add the app"),
                obj="USE_TZ",
                id="reliable_executor.E004",
            )
        )
    cache_alias = raw.get("REDIS_CACHE_ALIAS")
    if storage == "redis" and cache_alias and cache_alias not in getattr(settings, "CACHES", {}):
        errors.append(
            Error(
                f"{SETTING_NAME}['REDIS_CACHE_ALIAS'] = {cache_alias!r} is not a key of CACHES",
                hint=see("settings.md", "REDIS_CACHE_ALIAS"),
                obj="REDIS_CACHE_ALIAS",
                id="reliable_executor.E003",
            )
        )
    elif storage == "redis" and cache_alias and redis_installed():
        errors.extend(_check_cache_backend(cache_alias))
    return errors


def _check_cache_backend(alias: str) -> list[CheckMessage]:
    """REDIS_CACHE_ALIAS names a cache whose Redis connection can be shared (E009)."""
    from .storage.redis.connection import cache_backend_problem, is_shareable_cache

    try:
        backend = import_string(settings.CACHES[alias]["BACKEND"])
    except (ImportError, KeyError):
        return []  # Django's own cache checks and caches[alias] report a bad BACKEND
    if isinstance(backend, type) and not is_shareable_cache(backend):
        return [
            Error(
                cache_backend_problem(alias, backend),
                hint=see("settings.md", "REDIS_CACHE_ALIAS"),
                obj="REDIS_CACHE_ALIAS",
                id="reliable_executor.E009",
            )
        ]
    return []


def redis_installed() -> bool:
    # find_spec, not an import: the check stays cheap, and an entry of None in sys.modules
    # (how a blocked import is spelled) counts as missing.
    try:
        return importlib.util.find_spec("redis") is not None
    except ValueError:  # a module in sys.modules without __spec__
        return "redis" in sys.modules


# The claim statement on SQLite is UPDATE ... RETURNING, which SQLite has had since 3.35.
MIN_SQLITE = (3, 35, 0)


@register(Tags.database)
def check_database(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """With --database (or, on Django 6, before commands): the task database answers and can
    run the claim statement; with the Redis storage, Redis answers a PING."""
    raw = getattr(settings, SETTING_NAME, None) or {}
    if validate(raw):
        return []
    if raw.get("STORAGE", "database") == "redis":
        return _check_redis() if databases else []
    if raw.get("STORAGE", "database") != "database":
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
                hint="Start the database (or fix DATABASES); `runexecutor --wait` waits for "
                "it instead.",
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
                    hint=see("settings.md", "Validation"),
                    obj="DATABASE_ALIAS",
                    id="reliable_executor.E007",
                )
            ]
    return []


def _check_redis() -> list[CheckMessage]:
    """Redis answers a PING through the client the storage would use (W002)."""
    if not redis_installed():
        return []  # E005 says so
    from .storage.redis.connection import connect, describe

    executor_settings = get_settings()
    cache_alias = executor_settings.REDIS_CACHE_ALIAS
    if cache_alias and (
        cache_alias not in getattr(settings, "CACHES", {}) or _check_cache_backend(cache_alias)
    ):
        return []  # E003 or E009 says so
    where = describe(executor_settings)
    try:
        client = connect(executor_settings)
        try:
            client.ping()
            found = _redis_server_problems(client, where, executor_settings)
        finally:
            client.close()
    except Exception as exc:
        # A warning, not an error: Redis is not needed to migrate the SQL database or to open a
        # shell, and Django 6 runs these checks before every command. runexecutor refuses to
        # start without Redis on its own, and a submit raises StorageUnavailableError.
        return [
            Warning(
                f"Redis at {where} cannot be reached: {type(exc).__name__}: {exc}",
                hint="Start Redis (or fix REDIS_URL); `runexecutor --wait` waits for it instead. "
                + see("troubleshooting.md", "Redis cannot be reached"),
                obj="STORAGE",
                id="reliable_executor.W002",
            )
        ]
    return found


def _redis_server_problems(client: Any, where: str, executor_settings: Any) -> list[CheckMessage]:
    """The Redis server's configuration that may lose tasks (W001), and a REDIS_SHARDS other
    than the layout recorded under KEY_PREFIX (E010)."""
    from .storage.redis.access import _unavailable_errors
    from .storage.redis.layout import layout_problem
    from .storage.redis.server_config import config_warnings

    found: list[CheckMessage] = [
        Warning(
            warning,
            hint=see("redis.md", "Durability: configure the Redis server"),
            obj="STORAGE",
            id="reliable_executor.W001",
        )
        for warning in config_warnings(client, where, _unavailable_errors())
    ]
    problem = layout_problem(client, executor_settings.KEY_PREFIX, executor_settings.REDIS_SHARDS)
    if problem is not None:
        found.append(
            Error(
                problem,
                hint=see("scaling.md", "Changing the number of shards"),
                obj="REDIS_SHARDS",
                id="reliable_executor.E010",
            )
        )
    return found
