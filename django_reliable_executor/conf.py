"""RELIABLE_EXECUTOR -> one frozen, validated settings object, rebuilt on setting_changed."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .core.numbers import is_int, is_number
from .core.option_names import guess
from .core.options import RULES as OPTION_RULES
from .core.options import TaskOptions
from .core.parameter_index import MAX_KEY_CHARS

SETTING_NAME = "RELIABLE_EXECUTOR"


@dataclasses.dataclass(frozen=True)
class ExecutorSettings:
    """Every RELIABLE_EXECUTOR key, typed; see docs/settings.md for what each one does."""

    STORAGE: str = "database"
    DATABASE_ALIAS: str = "default"
    REDIS_URL: str = "redis://127.0.0.1:6379/0"
    REDIS_CACHE_ALIAS: str | None = None
    REDIS_CLUSTER: bool = False
    # The two dicts take no part in hashing (the settings object stays hashable); get_settings
    # stores copies, so changing the Django setting's dicts in place changes nothing here.
    REDIS_SENTINEL: dict[str, Any] | None = dataclasses.field(default=None, hash=False)
    REDIS_OPTIONS: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)
    KEY_PREFIX: str = "reliable_executor"
    REDIS_SHARDS: int = 1  # hash tags of KEY_PREFIX the queues are spread over (docs/settings.md)
    CORE_POOL_SIZE: int = 5
    MAX_POOL_SIZE: int = 10
    QUEUE_CAPACITY: int = 100
    ASYNC_CONCURRENCY: int = 100  # async handlers at once on a worker's event loop
    POOL: str = "thread"  # "thread" | "process": where runexecutor runs synchronous handlers
    MAX_TASKS_PER_CHILD: int | None = None  # process pool: tasks before a child is replaced
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
    # HTTP API (django_reliable_executor.api): key id -> shared secret; empty = no signed access.
    API_KEYS: dict[str, str] = dataclasses.field(default_factory=dict, hash=False)
    API_SIGNATURE_WINDOW: float = 300.0
    # Schedules: how late a run may fire and still count as on time (misfire="skip"), and the
    # most missed runs one schedule fires after downtime (misfire="catch_up").
    SCHEDULE_MISFIRE_GRACE: float = 60.0
    SCHEDULE_CATCH_UP_LIMIT: int = 100
    # Top-level parameter keys the storage indexes at submit, so that list_tasks(parameter=...)
    # and the admin's search find their values without reading every task (docs/admin.md).
    SEARCHABLE_PARAMETERS: tuple[str, ...] = ()

    @property
    def task_database(self) -> str | None:
        """The Django database alias the tasks live in (DATABASE_ALIAS), or None when they
        live outside Django's databases (Redis), where Django's database checks do not look."""
        return self.DATABASE_ALIAS if self.STORAGE == "database" else None

    @functools.cached_property  # kept in the instance's __dict__: frozen fields stay as they are
    def task_options(self) -> TaskOptions:
        """The options a task takes when neither its submit nor its handler gives them."""
        return TaskOptions(
            retry_limit=self.DEFAULT_RETRY_LIMIT,
            retry_interval=self.DEFAULT_RETRY_INTERVAL,
            retry_backoff=self.DEFAULT_RETRY_BACKOFF,
            max_duration_millis=self.DEFAULT_MAX_DURATION,
            queue="default",
            priority=0,
        )


KNOWN_KEYS = frozenset(f.name for f in dataclasses.fields(ExecutorSettings))
# REDIS_SHARDS at most: one shard per Redis Cluster hash slot.
MAX_REDIS_SHARDS = 16384


def _nonneg_int(v: Any) -> bool:
    return is_int(v) and v >= 0


def _pos_int(v: Any) -> bool:
    return is_int(v) and v > 0


def _pos_number(v: Any) -> bool:
    return is_number(v) and v > 0


def _nonempty_str(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


# How many keys SEARCHABLE_PARAMETERS may name: each adds an index entry to every task.
MAX_SEARCHABLE = 20


def _searchable_keys(v: Any) -> bool:
    return (
        isinstance(v, (list, tuple))
        and len(v) <= MAX_SEARCHABLE
        and len(set(map(str, v))) == len(v)
        and all(_nonempty_str(key) and len(key) <= MAX_KEY_CHARS for key in v)
    )


SENTINEL_KEYS = ("sentinels", "service_name", "db", "password", "username", "sentinel_kwargs")
SENTINEL_SHAPE = (
    "None or a dict {'sentinels': [[host, port], ...] (at least one), 'service_name': str, "
    "and optionally 'db': int >= 0, 'password': str or None, 'username': str or None, "
    "'sentinel_kwargs': dict}"
)


def _sentinel_problem(v: Any) -> str | None:
    """What is wrong with a REDIS_SENTINEL dict, or None."""
    if not isinstance(v, dict):
        return f"got {type(v).__name__}"
    unknown = sorted(str(key) for key in set(v) - set(SENTINEL_KEYS))
    if unknown:
        return f"unknown key {unknown[0]!r}"
    for key in ("sentinels", "service_name"):
        if key not in v:
            return f"{key!r} is missing"
    sentinels = v["sentinels"]
    if not isinstance(sentinels, (list, tuple)) or not sentinels:
        return "'sentinels' must be a non-empty list"
    for node in sentinels:
        if not (
            isinstance(node, (list, tuple))
            and len(node) == 2
            and _nonempty_str(node[0])
            and is_int(node[1])
            and 0 < node[1] <= 65535
        ):
            return f"sentinel {node!r} is not a [host, port] pair"
    if not _nonempty_str(v["service_name"]):
        return "'service_name' must be a non-empty string"
    if "db" in v and not _nonneg_int(v["db"]):
        return "'db' must be an integer >= 0"
    for key in ("password", "username"):
        if v.get(key) is not None and not isinstance(v[key], str):
            return f"{key!r} must be a string or None"
    if not isinstance(v.get("sentinel_kwargs", {}), dict):
        return "'sentinel_kwargs' must be a dict"
    return None


def _options_problem(v: Any) -> str | None:
    if not isinstance(v, dict):
        return f"got {type(v).__name__}"
    for key in v:
        if not (isinstance(key, str) and key.isidentifier()):
            return f"{key!r} is not a keyword argument name"
    return None


API_KEY_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
API_SECRET_MIN_LENGTH = 32


def _api_keys_problem(v: Any) -> str | None:
    """What is wrong with an API_KEYS dict, or None (never shows a secret)."""
    if not isinstance(v, dict):
        return f"got {type(v).__name__}"
    for key_id, secret in v.items():
        if not (
            isinstance(key_id, str) and 1 <= len(key_id) <= 64 and set(key_id) <= API_KEY_ID_CHARS
        ):
            return f"key id {key_id!r} is not 1..64 characters of letters, digits, '.', '_', '-'"
        if not isinstance(secret, str) or len(secret) < API_SECRET_MIN_LENGTH:
            return (
                f"the secret of key id {key_id!r} must be a string of at least "
                f"{API_SECRET_MIN_LENGTH} characters"
            )
    return None


# key -> (test, what a good value looks like)
_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "STORAGE": (lambda v: v in ("database", "redis"), "'database' or 'redis'"),
    "DATABASE_ALIAS": (_nonempty_str, "a name in DATABASES"),
    "REDIS_URL": (
        lambda v: isinstance(v, str) and v.split("://", 1)[0] in ("redis", "rediss", "unix"),
        "a redis://, rediss:// or unix:// URL",
    ),
    "REDIS_CACHE_ALIAS": (lambda v: v is None or _nonempty_str(v), "None or a name in CACHES"),
    "REDIS_CLUSTER": (lambda v: isinstance(v, bool), "True or False"),
    "REDIS_SENTINEL": (lambda v: v is None or _sentinel_problem(v) is None, SENTINEL_SHAPE),
    "REDIS_OPTIONS": (
        lambda v: _options_problem(v) is None,
        "a dict of keyword arguments for the redis-py client, e.g. {'ssl_ca_certs': path}",
    ),
    "KEY_PREFIX": (
        lambda v: _nonempty_str(v) and not any(c in v for c in "{} \t\r\n"),
        "a non-empty string without braces or whitespace",
    ),
    "REDIS_SHARDS": (
        lambda v: _pos_int(v) and v <= MAX_REDIS_SHARDS,
        f"an integer from 1 to {MAX_REDIS_SHARDS}",
    ),
    "CORE_POOL_SIZE": (_pos_int, "an integer >= 1"),
    "MAX_POOL_SIZE": (_pos_int, "an integer >= 1"),
    "QUEUE_CAPACITY": (_nonneg_int, "an integer >= 0"),
    "ASYNC_CONCURRENCY": (_nonneg_int, "an integer >= 0"),
    "POOL": (lambda v: v in ("thread", "process"), "'thread' or 'process'"),
    "MAX_TASKS_PER_CHILD": (lambda v: v is None or _pos_int(v), "None or an integer >= 1"),
    "POLL_INTERVAL": (_pos_number, "a number of seconds > 0"),
    "LEASE_TIMEOUT": (_pos_number, "a number of seconds > 0"),
    "MASTER_LOCK_TTL": (_pos_number, "a number of seconds > 0"),
    # The defaults of task options: the same rule as the option itself (options.RULES).
    "DEFAULT_RETRY_LIMIT": OPTION_RULES["retry_limit"],
    "DEFAULT_RETRY_INTERVAL": OPTION_RULES["retry_interval"],
    "DEFAULT_RETRY_BACKOFF": OPTION_RULES["retry_backoff"],
    "DEFAULT_RETRY_BACKOFF_MAX": (_nonneg_int, "an integer number of milliseconds >= 0"),
    "DEFAULT_MAX_DURATION": OPTION_RULES["max_duration_millis"],
    "FINISHED_RETENTION": (lambda v: is_number(v) and v >= 0, "a number of seconds >= 0"),
    "MAX_PARAMETER_BYTES": (_pos_int, "an integer number of bytes >= 1"),
    "ALLOW_UNKNOWN_TASKS": (lambda v: isinstance(v, bool), "True or False"),
    "METRICS_PORT": (lambda v: v is None or (is_int(v) and 0 <= v <= 65535), "None or 0-65535"),
    "API_KEYS": (
        lambda v: _api_keys_problem(v) is None,
        "a dict {key id: shared secret of at least 32 characters}",
    ),
    "SCHEDULE_MISFIRE_GRACE": (lambda v: is_number(v) and v >= 0, "a number of seconds >= 0"),
    "SCHEDULE_CATCH_UP_LIMIT": (_pos_int, "an integer > 0"),
    "SEARCHABLE_PARAMETERS": (
        _searchable_keys,
        f"a list of at most {MAX_SEARCHABLE} distinct top-level parameter keys, each a "
        f"non-empty string of at most {MAX_KEY_CHARS} characters",
    ),
    "API_SIGNATURE_WINDOW": (
        lambda v: is_number(v) and 1 <= v <= 3600,
        "a number of seconds from 1 to 3600",
    ),
}


def mask_url(url: str) -> str:
    """``url`` with the password (in the user info or a ``password=`` query item) as ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hostport = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":***"
        netloc = f"{userinfo}@{hostport}"
    query = "&".join(
        item.split("=", 1)[0] + "=***" if item.lower().startswith("password=") else item
        for item in parts.query.split("&")
    )
    # Rebuilt by hand: urlunsplit drops the empty authority of unix:///path.
    masked = f"{parts.scheme}://{netloc}{parts.path}"
    if query:
        masked += f"?{query}"
    return f"{masked}#{parts.fragment}" if parts.fragment else masked


def _shown(key: str, value: Any) -> str:
    """repr() of a setting's value for a message, its passwords masked."""
    if key == "REDIS_URL" and isinstance(value, str):
        return repr(mask_url(value))
    if key == "API_KEYS" and isinstance(value, dict):
        return repr({key_id: "***" for key_id in value})
    return repr(_masked(value))


def _masked(value: Any) -> Any:
    """A copy of nested dicts and lists with the value of every "...password..." key as ***."""
    if isinstance(value, dict):
        return {
            key: "***" if "password" in str(key).lower() and item is not None else _masked(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(_masked(item) for item in value)
    return value


# key -> what exactly is wrong with a value its rule refused, added to the message
_REASONS: dict[str, Callable[[Any], str | None]] = {
    "REDIS_SENTINEL": _sentinel_problem,
    "REDIS_OPTIONS": _options_problem,
    "API_KEYS": _api_keys_problem,
}


def validate(raw: Any) -> list[tuple[str, str]]:
    """Return ``(key, message)`` for every problem in a RELIABLE_EXECUTOR value."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        return [(SETTING_NAME, f"{SETTING_NAME} must be a dict, got {type(raw).__name__}")]
    problems = []
    for key in sorted(set(raw) - KNOWN_KEYS, key=str):
        problems.append(
            (key, f"{SETTING_NAME}[{key!r}] is not a known key{guess(key, KNOWN_KEYS)}")
        )
    for key, (test, expected) in _RULES.items():
        if key in raw and not test(raw[key]):
            shown = _shown(key, raw[key])
            message = f"{SETTING_NAME}[{key!r}] = {shown} is invalid: expected {expected}"
            reason = _REASONS[key](raw[key]) if key in _REASONS else None
            problems.append((key, f"{message} ({reason})" if reason else message))
    if not problems:
        problems.extend(_combination_problems(_with_defaults(raw)))
    return problems


def _with_defaults(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` over the defaults. A CORE_POOL_SIZE above the default MAX_POOL_SIZE, without a
    MAX_POOL_SIZE of its own, raises the maximum with it (as runexecutor --core-pool-size
    does)."""
    merged = {**dataclasses.asdict(ExecutorSettings()), **raw}
    if "MAX_POOL_SIZE" not in raw and merged["CORE_POOL_SIZE"] > merged["MAX_POOL_SIZE"]:
        merged["MAX_POOL_SIZE"] = merged["CORE_POOL_SIZE"]
    return merged


def _combination_problems(merged: dict[str, Any]) -> list[tuple[str, str]]:
    """Problems of valid values that do not go together."""
    problems = []
    if merged["MAX_POOL_SIZE"] < merged["CORE_POOL_SIZE"]:
        problems.append(
            (
                "MAX_POOL_SIZE",
                f"{SETTING_NAME}['MAX_POOL_SIZE'] = {merged['MAX_POOL_SIZE']} must be >= "
                f"CORE_POOL_SIZE ({merged['CORE_POOL_SIZE']})",
            )
        )
    if merged["REDIS_CACHE_ALIAS"] and (merged["REDIS_SENTINEL"] or merged["REDIS_CLUSTER"]):
        problems.append(
            (
                "REDIS_CACHE_ALIAS",
                f"{SETTING_NAME}['REDIS_CACHE_ALIAS'] cannot be combined with REDIS_SENTINEL or "
                "REDIS_CLUSTER: the cache's own connection settings apply",
            )
        )
    if merged["REDIS_CLUSTER"] and merged["REDIS_SENTINEL"]:
        problems.append(
            (
                "REDIS_CLUSTER",
                f"{SETTING_NAME}['REDIS_CLUSTER'] = True cannot be combined with REDIS_SENTINEL: "
                "a Redis Cluster fails over by itself, without Sentinel",
            )
        )
    elif merged["REDIS_CLUSTER"] and not merged["REDIS_CACHE_ALIAS"]:
        url = urlsplit(merged["REDIS_URL"])
        if url.scheme == "unix" or url.path.strip("/") not in ("", "0"):
            problems.append(
                (
                    "REDIS_URL",
                    f"{SETTING_NAME}['REDIS_URL'] = {mask_url(merged['REDIS_URL'])!r} is invalid "
                    "with REDIS_CLUSTER = True: expected a redis:// or rediss:// URL of any one "
                    "node, with database 0 (a Cluster has no other database)",
                )
            )
    return problems


def _normalised_sentinel(config: dict[str, Any]) -> dict[str, Any]:
    """A copy with every key present and the sentinels as (host, port) tuples."""
    return {
        "sentinels": [(host, port) for host, port in config["sentinels"]],
        "service_name": config["service_name"],
        "db": config.get("db", 0),
        "password": config.get("password"),
        "username": config.get("username"),
        "sentinel_kwargs": dict(config.get("sentinel_kwargs") or {}),
    }


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
        if "MAX_POOL_SIZE" not in raw:
            values["MAX_POOL_SIZE"] = _with_defaults(raw)["MAX_POOL_SIZE"]
        values["REDIS_OPTIONS"] = dict(values.get("REDIS_OPTIONS") or {})
        values["API_KEYS"] = dict(values.get("API_KEYS") or {})
        values["SEARCHABLE_PARAMETERS"] = tuple(values.get("SEARCHABLE_PARAMETERS") or ())
        if values.get("REDIS_SENTINEL"):
            values["REDIS_SENTINEL"] = _normalised_sentinel(values["REDIS_SENTINEL"])
        for key in (
            "POLL_INTERVAL",
            "LEASE_TIMEOUT",
            "MASTER_LOCK_TTL",
            "FINISHED_RETENTION",
            "API_SIGNATURE_WINDOW",
        ):
            if key in values:
                values[key] = float(values[key])
        _cached = ExecutorSettings(**values)
    return _cached


def _reset(*, setting: str, **kwargs: Any) -> None:
    """Read the settings again after a test overrides them (apps.ready resets the service)."""
    global _cached
    if setting == SETTING_NAME:
        _cached = None


setting_changed.connect(_reset)
