"""What every part of the Redis storage shares: the client, key names, running a script."""

from __future__ import annotations

import builtins
import copy
import datetime as dt
import functools
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured

from ...core.clock import Clock
from ...core.flow_limits import NO_FLOW_LIMITS, FlowLimits
from ...core.records import StepInfo, TaskInfo, copy_with
from ...core.states import LIVE_STATUSES, WAITING_STATUSES
from ...exceptions import StorageUnavailableError
from ..base import TaskStorage
from .codec import fair_set_key, micros, step_infos, text, to_info
from .layout import layout_problem
from .outbox import DELIVERY_CHUNK, deliver
from .scripts import Scripts
from .sharding import CONTROL_SHARD, ShardLayout, directory_of
from .waiting import ShardWaiters

logger = logging.getLogger("django_reliable_executor")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
R = TypeVar("R")
READ_CHUNK = 1000
# Sharded: how often the shards holding tasks of a queue not their own are read (_strays).
STRAYS_SECONDS = 10.0
# The status sets of states.py as the stored values.
WAITING = tuple(sorted(s.value for s in WAITING_STATUSES))
LIVE = tuple(sorted(s.value for s in LIVE_STATUSES))
# Sharded: the scripts that may write messages to their shard's outbox (an ending with
# dependents or a batch elsewhere, a retried member, a batch finishing): each is followed by a
# delivery of that outbox, so a cross-shard edge takes effect at once, not a master round later.
# (complete.lua and fail.lua say in their reply whether they sent one: transitions.py
# delivers only then.)
SENDING = frozenset(
    {"expire_claim", "expire", "recover", "cancel", "retry"} | {"batch_seal", "purge"}
)


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


class IdleView(threading.local):
    """A claiming thread's view of its shards on a sharded storage (a worker's fetcher waits
    and claims on one thread; another thread's waits do not change what it skips)."""

    def __init__(self) -> None:
        # the (shard, queue) pairs the last idle wait found nothing for (no token, nothing
        # due on that shard), which the claims after it skip until one of them takes a task
        self.quiet: frozenset[tuple[int, str]] = frozenset()
        # time.monotonic() of the last claim sent to each shard (the sweeps)
        self.claimed_at: dict[int, float] = {}


class RedisAccess(TaskStorage):
    """The client and key prefix of one Redis storage, and the helpers its parts share.

    Every key name starts with the prefix of one shard (sharding.py): ``prefixes[i]`` is shard
    i's, ``p`` the control shard's (what belongs to no queue). With one shard (the default)
    there is one prefix, ``{KEY_PREFIX}:``. ``shards`` (REDIS_SHARDS) above 1 is the sharded
    layout of docs/redis-shards.md: each queue's keys on its shard."""

    def __init__(
        self,
        client: Any,
        key_prefix: str = "reliable_executor",
        *,
        clock: Clock | None = None,
        backoff_cap_millis: int = 300000,
        where: str = "redis",
        owns_client: bool = True,
        shards: int = 1,
        flow_limits: FlowLimits = NO_FLOW_LIMITS,
    ) -> None:
        super().__init__(clock, flow_limits)
        self.client = client
        self.key_prefix = key_prefix
        self.layout = ShardLayout(key_prefix, shards)
        self.prefixes = self.layout.prefixes
        self.p = self.prefixes[CONTROL_SHARD]
        self.sharded = shards > 1
        self.backoff_cap_millis = backoff_cap_millis
        self.where = where
        self._owns_client = owns_client
        # One key per shard, passed to its scripts: routes the call to the shard's hash slot.
        self._routes = [[prefix + "counts"] for prefix in self.prefixes]
        self._scripts = Scripts(client)
        self._unavailable = _unavailable_errors()
        # (shard, queue) -> when its next scheduled task there is due, as the last claim of
        # it saw it
        self._next_due: dict[tuple[int, str], int | None] = {}
        # where the purge chore's sweep of each shard's queue set goes on (SSCAN cursors)
        self._queue_cursors = [0] * shards
        self._claim_turn = 0  # which shard of its queues a sharded claim visits first
        self._waiters: ShardWaiters | None = None  # a sharded idle wait's threads, once used
        # Sharded: what the claims of the calling thread may skip (claiming.py)
        self._idle = IdleView()
        # Sharded: the shard of each task claimed here off its id's directory shard (a given
        # id), for its heartbeats; each heartbeat keeps only the tasks it beats.
        self._held_on: dict[str, int] = {}
        self._held_lock = threading.Lock()
        # Sharded: the shards holding tasks of a queue not its own (_strays), and when read
        self._strays_seen: dict[str, frozenset[int]] = {}
        self._strays_read_at = -math.inf
        self._chore_scope: frozenset[int] | None = None  # chores_on: the chores' shards
        self._scoped: dict[frozenset[int], RedisAccess] = {}
        self._layout_checked = False  # check_layout: REDIS_SHARDS is the recorded layout

    @property
    def chore_shards(self) -> int:
        return len(self.prefixes)

    def chores_on(self, shards: frozenset[int]) -> TaskStorage:
        """A view sharing everything with this storage (client, scripts, state) but the
        shards its chores visit."""
        if not self.sharded:
            return self
        scope = frozenset(shards)
        if not scope <= set(range(len(self.prefixes))):
            raise ValueError(f"shards {sorted(scope)} are not all of {len(self.prefixes)}")
        view = self._scoped.get(scope)
        if view is None:
            view = copy.copy(self)
            view._chore_scope = scope
            self._scoped[scope] = view
        return view

    def _chore_range(self) -> list[int]:
        """The shards the chores visit, in order."""
        if self._chore_scope is None:
            return list(range(len(self.prefixes)))
        return sorted(self._chore_scope)

    def _run(
        self, name: str, *args: Any, now: dt.datetime | None = None, shard: int = CONTROL_SHARD
    ) -> Any:
        """Run script ``name`` on ``shard``: its prefix and now come first in ARGV. Sharded, a
        script that may send messages is followed by the delivery of its shard's outbox."""
        now = now or self.clock.now()
        reply = self._scripts.run(
            name, self._routes[shard], (self.prefixes[shard], micros(now), *args)
        )
        if self.sharded and name in SENDING:
            self._deliver_now(shard)
        return reply

    def _deliver_now(self, shard: int) -> None:
        """Deliver ``shard``'s outbox (and what that sends on) right after a change there. The
        change is made: a failure here is left to the master's chore, which delivers every
        outbox each round (deliver_messages)."""
        try:
            deliver(
                self.client,
                self.prefixes,
                self._apply,
                [shard],
                DELIVERY_CHUNK,
                2 * len(self.prefixes),
            )
        except Exception:
            logger.warning(
                "could not deliver shard %d's messages now; the master will", shard, exc_info=True
            )

    def _apply(self, messages: list[Any], shard: int) -> int:
        return int(
            self._scripts.run(
                "outbox_apply",
                self._routes[shard],
                (self.prefixes[shard], micros(self.clock.now()), *messages),
            )
        )

    @guarded
    def deliver_messages(self, limit: int) -> int:
        if not self.sharded:
            return 0
        # The outboxes of the shards whose chores this view runs (a chore lock each); what
        # their applying sends on to other shards is delivered in the same round.
        shards = self._chore_range()
        visits = 2 * len(self.prefixes)
        return deliver(self.client, self.prefixes, self._apply, shards, limit, visits)

    def new_task_id(self, queue: str, task_name: str | None = None) -> str:
        # Sharded: an id whose directory shard is the shard the task is stored on (drawn
        # again until it is, N draws on average), so that storing it needs no directory
        # entry (id_reserve.lua).
        task_id = uuid.uuid4().hex
        if self.sharded:
            home = self.layout.shard_of(queue)
            if task_name is not None:
                home = self._store_shard(task_name, queue)
            while directory_of(task_id, self.layout.shards) != home:
                task_id = uuid.uuid4().hex
        return task_id

    @guarded
    def get(self, task_id: str) -> TaskInfo | None:
        # Here rather than in Reading: a retry reads the task first too.
        if not self.sharded:
            shard, values = CONTROL_SHARD, self.client.hgetall(self._tkey(task_id))
        else:
            shard, values = self._locate(task_id)
        if not values:
            return None
        plain = {text(k): text(v) for k, v in values.items()}
        info = to_info(task_id, plain)
        if "sn" in plain:  # it stored durable steps (step.lua): read them, one more round trip
            steps = self.client.hgetall(self.prefixes[shard] + "steps:" + task_id)
            return copy_with(info, steps=step_infos(steps))
        return info

    def _locate(self, task_id: str) -> tuple[int, dict[Any, Any]]:
        """Sharded: the shard of task ``task_id`` and its hash (empty when there is none; the
        control shard then). Its directory shard holds it or names its home (a schedule's
        fire is native to its shard: sharding.native_id); a task stored off its directory
        shard in one script (a batch's callback with a given id) is found by reading every
        shard."""
        directory = directory_of(task_id, self.layout.shards)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.prefixes[directory] + "t:" + task_id)
        pipe.get(self.prefixes[directory] + "i:" + task_id)
        values, entry = pipe.execute()
        if values:
            return directory, values
        if entry is not None:
            home = int(text(entry).split(" ", 1)[0])
            values = self.client.hgetall(self.prefixes[home] + "t:" + task_id)
            if values:
                return home, values
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.hgetall(prefix + "t:" + task_id)
        found = [(shard, values) for shard, values in enumerate(pipe.execute()) if values]
        return found[0] if found else (CONTROL_SHARD, {})

    def _steps_of(
        self, found: Mapping[str, Mapping[str, str]], shard: int
    ) -> dict[str, tuple[StepInfo, ...]]:
        """The durable steps of those of these task hashes (of ``shard``) that stored any
        (step.lua counts them in ``sn``), in one pipeline; none read for the others."""
        with_steps = [task_id for task_id, values in found.items() if "sn" in values]
        if not with_steps:
            return {}
        steps = self._read_many(with_steps, (self.prefixes[shard] + "steps:").__add__)
        return {task_id: step_infos(values) for task_id, values in steps.items()}

    def _task_shard(self, task_id: str) -> int:
        """The shard holding task ``task_id`` (the control shard when none does)."""
        if not self.sharded:
            return CONTROL_SHARD
        return self._locate(task_id)[0]

    def _store_shard(
        self, task_name: str, queue: str, homes: Mapping[str, str] | None = None
    ) -> int:
        """The shard a task of ``task_name`` submitted to ``queue`` is stored on: its queue's,
        or for a limited name (``homes``: flow_limits.homes(), read now when not given) the shard
        of the name's own queue, its *home shard*, which keeps all of the name's limits."""
        if not self.sharded:
            return CONTROL_SHARD
        if homes is None:
            homes = self.flow_limits.homes()
        return self.layout.shard_of(homes.get(task_name, queue))

    def _home_shards(self) -> frozenset[int]:
        """Sharded: the home shards of the limited names (see _store_shard)."""
        return frozenset(self.layout.shard_of(queue) for queue in self.flow_limits.homes().values())

    def _queue_shards(self, queue: str, homes: frozenset[int] | None = None) -> list[int]:
        """The shards that may hold tasks of ``queue``: its own shard, first, then the home
        shards of the limited names (``homes``: _home_shards, read now when not given) and the
        other shards whose ``queues`` set named it when last read (_strays)."""
        own = self.layout.shard_of(queue)
        if not self.sharded:
            return [own]
        if homes is None:
            homes = self._home_shards()
        return [own, *sorted((homes | self._strays().get(queue, frozenset())) - {own})]

    def _strays(self) -> dict[str, frozenset[int]]:
        """Sharded: queue -> the shards other than its own that hold tasks of it, from every
        shard's ``queues`` set, read again when older than STRAYS_SECONDS (one pipeline).
        The limited names' home shards come from the registry at once; this finds those a
        registry no longer names (a limit removed, a name's queue changed, a submitter with
        other limits), whose waiting tasks would else be claimed by nobody."""
        now = time.monotonic()
        if now - self._strays_read_at < STRAYS_SECONDS:
            return self._strays_seen
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.smembers(prefix + "queues")
        found: dict[str, set[int]] = {}
        for shard, members in enumerate(pipe.execute()):
            for member in members:
                queue = text(member)
                if self.layout.shard_of(queue) != shard:
                    found.setdefault(queue, set()).add(shard)
        self._strays_seen = {queue: frozenset(shards) for queue, shards in found.items()}
        self._strays_read_at = now
        return self._strays_seen

    def _each_shard(
        self,
        items: Sequence[T],
        shard_of: Callable[[T], int],
        call: Callable[[Sequence[T], int], Sequence[R]],
    ) -> list[R]:
        """``call(part, shard)`` for the items of each shard (``shard_of(item)``), its results
        put back in the order of ``items``: one script call per shard."""
        if not self.sharded:
            return list(call(items, CONTROL_SHARD))
        groups: dict[int, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(shard_of(item), []).append(index)
        out: list[Any] = [None] * len(items)
        for shard, positions in sorted(groups.items()):
            results = call([items[p] for p in positions], shard)
            for position, result in zip(positions, results, strict=True):
                out[position] = result
        return out

    def _tkey(self, task_id: str, shard: int = CONTROL_SHARD) -> str:
        return self.prefixes[shard] + "t:" + task_id

    def _queue_prefix(self, queue: str) -> str:
        """The key prefix of ``queue``'s shard."""
        return self.prefixes[self.layout.shard_of(queue)] if self.sharded else self.p

    def _read_many(
        self,
        ids: Sequence[str],
        key: Callable[[str], str] | None = None,
        *,
        shard: int = CONTROL_SHARD,
    ) -> dict[str, dict[str, str]]:
        """Full hashes of these ids (missing ones left out), a pipeline per chunk: tasks of
        ``shard``, or whatever ``key`` names (schedules)."""
        if key is None:
            prefix = self.prefixes[shard] + "t:"
            key = prefix.__add__
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

    def _fair_sets(
        self, places: Sequence[tuple[str, str, Sequence[Any]]]
    ) -> builtins.list[tuple[int, str]]:
        """The fair sets (fairness="round_robin": lua/_common.lua's fair_push) of these
        places: (queue, its shard's prefix, the priorities its ``fprio:<queue>`` lists, read
        by the caller in its own pipeline), as (index of the place, key of the set); from the
        ``fnames:<queue>:<prio>`` sets in one pipelined round trip, none when no place lists a
        priority."""
        found = [
            (index, queue, prefix, text(priority))
            for index, (queue, prefix, priorities) in enumerate(places)
            for priority in priorities
        ]
        if not found:
            return []
        pipe = self.client.pipeline(transaction=False)
        for _, queue, prefix, priority in found:
            pipe.smembers(f"{prefix}fnames:{queue}:{priority}")
        return [
            (index, fair_set_key(prefix, text(name), queue, priority))
            for (index, queue, prefix, priority), names in zip(found, pipe.execute(), strict=True)
            for name in sorted(names)
        ]

    def _due_ids(
        self,
        index: str,
        now: dt.datetime,
        limit: int,
        *,
        inclusive: bool,
        shard: int = CONTROL_SHARD,
    ) -> list[str]:
        bound = micros(now) if inclusive else "(" + micros(now)
        key = self.prefixes[shard] + index
        ids = self.client.zrangebyscore(key, "-inf", bound, start=0, num=limit)
        return [text(task_id) for task_id in ids]

    @guarded
    def check_layout(self) -> None:
        # Once per storage object: the layout of a prefix changes only offline (resharding).
        if self._layout_checked:
            return
        problem = layout_problem(self.client, self.key_prefix, self.layout.shards, record=True)
        if problem is not None:
            raise ImproperlyConfigured(problem)
        self._layout_checked = True

    def _queues(self) -> builtins.list[str]:
        """Every queue that holds a task (the ``queues`` set of every shard)."""
        if not self.sharded:
            return sorted(text(queue) for queue in self.client.smembers(self.p + "queues"))
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.smembers(prefix + "queues")
        return sorted({text(queue) for members in pipe.execute() for queue in members})

    def _sum_hashes(self, name: str) -> dict[str, int]:
        """Hash ``name`` of every shard, the values of equal fields added (counts)."""
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.hgetall(prefix + name)
        total: dict[str, int] = {}
        for values in pipe.execute():
            for field, value in values.items():
                total[text(field)] = total.get(text(field), 0) + int(value)
        return total

    def close(self) -> None:
        if self._waiters is not None:
            self._waiters.close()
        self._scripts.close()
        if self._owns_client:
            self.client.close()
