"""The layout a key prefix's tasks are stored in (REDIS_SHARDS), recorded under the prefix.

``{KEY_PREFIX}:layout`` STRING holds the number of shards, written by the first process that
stores a task or starts a worker (SET NX: the first writer wins) and changed only by
``manage.py executor shards N --apply``. A process with another REDIS_SHARDS would write and
read other keys than every other process (sharding.py), so it is refused: the worker does not
start, the system check reports E010, a submit raises ImproperlyConfigured.
"""

from __future__ import annotations

from typing import Any

from .codec import text


def layout_key(key_prefix: str) -> str:
    """The key of the recorded layout: the same whatever the number of shards (it lies in the
    one-shard layout's hash tag)."""
    return "{" + key_prefix + "}:layout"


def describe_layout(shards: int) -> str:
    return "REDIS_SHARDS = 1 (one shard)" if shards == 1 else f"REDIS_SHARDS = {shards}"


def recorded_layout(client: Any, key_prefix: str, shards: int | None = None) -> int | None:
    """The number of shards recorded for ``key_prefix``, None when none is. With ``shards``,
    record it first unless one is recorded already (atomic: SET NX), and return the one that
    holds."""
    key = layout_key(key_prefix)
    if shards is None:
        value = client.get(key)
    else:
        pipe = client.pipeline(transaction=False)
        pipe.set(key, str(shards), nx=True)
        pipe.get(key)
        value = pipe.execute()[1]
    return None if value is None else int(text(value))


def mismatch(key_prefix: str, recorded: int, shards: int) -> str:
    """The refusal's message, naming both layouts and the way out."""
    return (
        f"{describe_layout(shards)} here, but the tasks under KEY_PREFIX {key_prefix!r} are "
        f"stored in the layout {describe_layout(recorded)} (recorded in "
        f"{layout_key(key_prefix)}): this process would never see them, nor they its tasks. "
        f"Set REDIS_SHARDS = {recorded}, or change the layout as docs/scaling.md says "
        f"(drain, stop the workers, then manage.py executor shards {shards} --apply)."
    )


def layout_problem(
    client: Any, key_prefix: str, shards: int, *, record: bool = False
) -> str | None:
    """Why a process with ``shards`` may not use ``key_prefix`` (None when it may). With
    ``record``, a prefix with no recorded layout gets this one."""
    recorded = recorded_layout(client, key_prefix, shards if record else None)
    if recorded is None or recorded == shards:
        return None
    return mismatch(key_prefix, recorded, shards)
