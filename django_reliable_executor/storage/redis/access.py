"""What every part of the Redis storage shares: the client, key names, running a script."""

from __future__ import annotations

import builtins
import datetime as dt
import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...clock import Clock
from ...exceptions import StorageUnavailableError
from ...records import TaskInfo
from ...states import LIVE_STATUSES, WAITING_STATUSES
from ..base import TaskStorage
from .codec import micros, text, to_info
from .scripts import Scripts

F = TypeVar("F", bound=Callable[..., Any])
READ_CHUNK = 1000
# The status sets of states.py as the stored values.
WAITING = tuple(sorted(s.value for s in WAITING_STATUSES))
LIVE = tuple(sorted(s.value for s in LIVE_STATUSES))


def _unavailable_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import ConnectionError, TimeoutError

    return (ConnectionError, TimeoutError)  # BusyLoadingError (AOF replay) is a ConnectionError


def guarded(method: F) -> F:
    """Turn "Redis cannot be reached" into StorageUnavailableError naming where it was."""

    @functools.wraps(method)
    def wrapper(self: RedisAccess, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except self._unavailable as exc:
            raise StorageUnavailableError(
                f"Redis at {self.where} cannot be reached: {exc}"
            ) from exc

    return wrapper  # type: ignore[return-value]


class RedisAccess(TaskStorage):
    """The client and key prefix of one Redis storage, and the helpers its parts share."""

    def __init__(
        self,
        client: Any,
        key_prefix: str = "reliable_executor",
        *,
        clock: Clock | None = None,
        backoff_cap_millis: int = 300000,
        where: str = "redis",
        owns_client: bool = True,
    ) -> None:
        super().__init__(clock)
        self.client = client
        self.key_prefix = key_prefix
        self.p = "{" + key_prefix + "}:"
        self.backoff_cap_millis = backoff_cap_millis
        self.where = where
        self._owns_client = owns_client
        self._keys = [self.p + "counts"]  # routes every script to the prefix's hash slot
        self._scripts = Scripts(client)
        self._unavailable = _unavailable_errors()
        # queue -> when its next scheduled task is due, as the last claim of it saw it
        self._next_due: dict[str, int | None] = {}

    def _run(self, name: str, *args: Any, now: dt.datetime | None = None) -> Any:
        now = now or self.clock.now()
        return self._scripts.run(name, self._keys, (self.p, micros(now), *args))

    @guarded
    def get(self, task_id: str) -> TaskInfo | None:
        # Here rather than in Reading: a retry reads the task first too.
        values = self.client.hgetall(self._tkey(task_id))
        if not values:
            return None
        return to_info(task_id, {text(k): text(v) for k, v in values.items()})

    def _tkey(self, task_id: str) -> str:
        return self.p + "t:" + task_id

    def _read_many(
        self, ids: Sequence[str], key: Callable[[str], str] | None = None
    ) -> dict[str, dict[str, str]]:
        """Full hashes of these ids (missing ones left out), a pipeline per chunk: tasks, or
        whatever ``key`` names (schedules)."""
        key = key or self._tkey
        found: dict[str, dict[str, str]] = {}
        for start in range(0, len(ids), READ_CHUNK):
            chunk = ids[start : start + READ_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for one in chunk:
                pipe.hgetall(key(one))
            for one, values in zip(chunk, pipe.execute(), strict=True):
                if values:
                    found[one] = {text(k): text(v) for k, v in values.items()}
        return found

    def _due_ids(self, index: str, now: dt.datetime, limit: int, *, inclusive: bool) -> list[str]:
        bound = micros(now) if inclusive else "(" + micros(now)
        ids = self.client.zrangebyscore(self.p + index, "-inf", bound, start=0, num=limit)
        return [text(task_id) for task_id in ids]

    @guarded
    def server_warnings(self) -> builtins.list[str]:
        """What is wrong with the Redis server's configuration for holding tasks."""
        try:
            info = self.client.info("memory")
        except self._unavailable:
            raise
        except Exception:  # INFO refused (a restricted ACL user): nothing to say
            return []
        if isinstance(info, dict) and "maxmemory_policy" not in info:
            info = next(iter(info.values()), {})  # a Cluster client answers per node
        policy = text(info.get("maxmemory_policy", "noeviction"))
        if policy == "noeviction":
            return []
        return [
            f"Redis at {self.where} has maxmemory-policy {policy}: when memory runs short it "
            "deletes keys, and these keys are tasks. Set maxmemory-policy noeviction."
        ]

    def _queues(self) -> builtins.list[str]:
        """Every queue that holds a task (the ``queues`` set)."""
        return sorted(text(queue) for queue in self.client.smembers(self.p + "queues"))

    def close(self) -> None:
        self._scripts.close()
        if self._owns_client:
            self.client.close()
