"""RELIABLE_EXECUTOR -> one frozen, validated settings object, rebuilt on setting_changed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .retries import BACKOFF_CHOICES

SETTING_NAME = "RELIABLE_EXECUTOR"


@dataclasses.dataclass(frozen=True)
class ExecutorSettings:
    """Every RELIABLE_EXECUTOR key, typed; see docs/settings.md for what each one does."""

    STORAGE: str = "database"
    DATABASE_ALIAS: str = "default"
    REDIS_URL: str = "redis://127.0.0.1:6379/0"
    REDIS_CACHE_ALIAS: str | None = None
    KEY_PREFIX: str = "reliable_executor"
    CORE_POOL_SIZE: int = 5
    MAX_POOL_SIZE: int = 10
    QUEUE_CAPACITY: int = 100
    POLL_INTERVAL: float = 1.0
    LEASE_TIMEOUT: float = 60.0
    MASTER_LOCK_TTL: float = 10.0
    DEFAULT_RETRY_LIMIT: int = 3
    DEFAULT_RETRY_INTERVAL: int = 2000
    DEFAULT_RETRY_BACKOFF: str = "fixed"
    DEFAULT_RETRY_BACKOFF_MAX: int = 300000
    DEFAULT_MAX_DURATION: int | None = None
    FINISHED_RETENTION: float = 7 * 24 * 3600
    MAX_PARAMETER_BYTES: int = 1048576
    ALLOW_UNKNOWN_TASKS: bool = False
    METRICS_PORT: int | None = None


KNOWN_KEYS = frozenset(f.name for f in dataclasses.fields(ExecutorSettings))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _nonneg_int(v: Any) -> bool:
    return _is_int(v) and v >= 0


def _pos_int(v: Any) -> bool:
    return _is_int(v) and v > 0


def _pos_number(v: Any) -> bool:
    return _is_number(v) and v > 0


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


# key -> (test, what a good value looks like)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "STORAGE": (lambda v: v in ("database", "redis"), "'database' or 'redis'"),
    "DATABASE_ALIAS": (_nonempty_str, "a name in DATABASES"),
    "REDIS_URL": (
        lambda v: isinstance(v, str) and v.split("://", 1)[0] in ("redis", "rediss", "unix"),
        "a redis://, rediss:// or unix:// URL",
    ),
    "REDIS_CACHE_ALIAS": (lambda v: v is None or _nonempty_str(v), "None or a name in CACHES"),
    "KEY_PREFIX": (
        lambda v: _nonempty_str(v) and not any(c in v for c in "{} \t\r\n"),
        "a non-empty string without braces or whitespace",
    ),
    "CORE_POOL_SIZE": (_pos_int, "an integer >= 1"),
    "MAX_POOL_SIZE": (_pos_int, "an integer >= 1"),
    "QUEUE_CAPACITY": (_nonneg_int, "an integer >= 0"),
    "POLL_INTERVAL": (_pos_number, "a number of seconds > 0"),
    "LEASE_TIMEOUT": (_pos_number, "a number of seconds > 0"),
    "MASTER_LOCK_TTL": (_pos_number, "a number of seconds > 0"),
    "DEFAULT_RETRY_LIMIT": (_nonneg_int, "an integer >= 0"),
    "DEFAULT_RETRY_INTERVAL": (_nonneg_int, "an integer number of milliseconds >= 0"),
    "DEFAULT_RETRY_BACKOFF": (lambda v: v in BACKOFF_CHOICES, "'fixed' or 'exponential'"),
    "DEFAULT_RETRY_BACKOFF_MAX": (_nonneg_int, "an integer number of milliseconds >= 0"),
    "DEFAULT_MAX_DURATION": (lambda v: v is None or _pos_int(v), "None or milliseconds >= 1"),
    "FINISHED_RETENTION": (lambda v: _is_number(v) and v >= 0, "a number of seconds >= 0"),
    "MAX_PARAMETER_BYTES": (_pos_int, "an integer number of bytes >= 1"),
    "ALLOW_UNKNOWN_TASKS": (lambda v: isinstance(v, bool), "True or False"),
    "METRICS_PORT": (lambda v: v is None or (_is_int(v) and 0 <= v <= 65535), "None or 0-65535"),
}


def validate(raw: Any) -> list[tuple[str, str]]:
    """Return ``(key, message)`` for every problem in a RELIABLE_EXECUTOR value."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [(SETTING_NAME, f"{SETTING_NAME} must be a dict, got {type(raw).__name__}")]
    problems = []
    for key in sorted(set(raw) - KNOWN_KEYS):
        problems.append((key, f"{SETTING_NAME}[{key!r}] is not a known key"))
    for key, (test, expected) in _RULES.items():
        if key in raw and not test(raw[key]):
            problems.append(
                (key, f"{SETTING_NAME}[{key!r}] = {raw[key]!r} is invalid: expected {expected}")
            )
    merged = {**dataclasses.asdict(ExecutorSettings()), **raw}
    if not problems and merged["MAX_POOL_SIZE"] < merged["CORE_POOL_SIZE"]:
        problems.append(
            ("MAX_POOL_SIZE", f"{SETTING_NAME}['MAX_POOL_SIZE'] must be >= CORE_POOL_SIZE")
        )
    return problems


_cached: ExecutorSettings | None = None


def get_settings() -> ExecutorSettings:
    """The current settings; raises ImproperlyConfigured naming the first bad key."""
    global _cached
    if _cached is None:
        raw = getattr(django_settings, SETTING_NAME, None) or {}
        problems = validate(raw)
        if problems:
            raise ImproperlyConfigured(problems[0][1])
        values = dict(raw)
        for key in ("POLL_INTERVAL", "LEASE_TIMEOUT", "MASTER_LOCK_TTL", "FINISHED_RETENTION"):
            if key in values:
                values[key] = float(values[key])
        _cached = ExecutorSettings(**values)
    return _cached


def _reset(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting == SETTING_NAME:
        _cached = None
        from . import service  # local import: service depends on conf

        service.executor.reset()


setting_changed.connect(_reset)
