"""Changing REDIS_SHARDS: what to check before switching, and the switch of the recorded layout
(the change is offline and drained)."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from ...core.states import LIVE_STATUSES
from .codec import text
from .layout import describe_layout, layout_key, recorded_layout
from .sharding import ShardLayout

if TYPE_CHECKING:
    from . import RedisStorage

# Keys of a shard of the new layout counted at most (one is enough to refuse the switch).
KEYS_COUNTED = 100


@dataclasses.dataclass(frozen=True)
class ReshardCheck:
    """Whether the key prefix of a Redis storage may switch from ``current`` to ``target``
    shards: nothing unfinished in the current layout, nothing at all in the target one."""

    current: int
    target: int
    queue_shards: dict[str, int]  # each queue of the current layout -> its shard under target
    unfinished: int  # tasks CREATED, PENDING or RUNNING in the current layout
    schedules: int  # schedules of the current layout (not carried over: define them again)
    target_keys: dict[int, int]  # shard of the target layout -> keys found there (up to 100)
    undelivered: int = 0  # messages left in the current layout's outboxes (lua/_common.lua)
    paused: frozenset[str] = frozenset()  # paused queues, carried over by apply_reshard
    recorded: int | None = None  # the layout recorded under the prefix (layout.py)

    @property
    def ready(self) -> bool:
        return (
            self.current != self.target
            and self.recorded in (None, self.current)
            and self.unfinished == 0
            and self.undelivered == 0
            and not any(self.target_keys.values())
        )

    def problems(self) -> list[str]:
        """What stands in the way of the switch, one sentence each."""
        found = []
        if self.current == self.target:
            found.append(f"REDIS_SHARDS is {self.current} already")
        if self.recorded not in (None, self.current):
            assert self.recorded is not None
            found.append(
                f"the layout recorded under the key prefix is {describe_layout(self.recorded)}, "
                f"not this process's {describe_layout(self.current)}: run this check with "
                f"REDIS_SHARDS = {self.recorded}"
            )
        if self.unfinished:
            found.append(
                f"{self.unfinished} unfinished tasks in the current layout: stop submitting "
                "and let the workers drain them first"
            )
        if self.undelivered:
            found.append(
                f"{self.undelivered} messages between shards not delivered yet (a batch's "
                "count or callback, a dependency's outcome): let a worker run until they are"
            )
        for shard, keys in sorted(self.target_keys.items()):
            if keys:
                more = "+" if keys >= KEYS_COUNTED else ""
                found.append(
                    f"shard {shard} of the {self.target}-shard layout holds {keys}{more} keys "
                    "already (left by an earlier switch?): delete them or keep the current N"
                )
        return found


def check_reshard(storage: RedisStorage, target: int) -> ReshardCheck:
    """Read the current layout's unfinished tasks and schedules and SCAN for every shard of
    the ``target`` layout's keys (every node of a Cluster): an offline check, which reads the
    whole key space once per target shard. Raises ValueError for a bad ``target``."""
    layout = ShardLayout(storage.key_prefix, target)
    counts = storage.count()
    schedules = storage.count_schedules()
    target_keys = {}
    # The recorded layout's key lies in the one-shard layout's hash tag: not a key of it.
    record = layout_key(storage.key_prefix)
    for shard, prefix in enumerate(layout.prefixes):
        pattern = re.sub(r"([\\*?\[\]])", r"\\\1", prefix) + "*"
        found = 0
        for key in storage.client.scan_iter(match=pattern, count=1000):
            if text(key) == record:
                continue
            found += 1
            if found >= KEYS_COUNTED:
                break
        target_keys[shard] = found
    return ReshardCheck(
        current=storage.layout.shards,
        target=target,
        queue_shards={queue: layout.shard_of(queue) for queue in storage._queues()},
        unfinished=sum(counts[status] for status in LIVE_STATUSES),
        schedules=sum(schedules.values()),
        target_keys=target_keys,
        undelivered=sum(storage.client.llen(prefix + "outbox") for prefix in storage.prefixes),
        paused=frozenset(storage.paused_queues()),
        recorded=recorded_layout(storage.client, storage.key_prefix),
    )


def apply_reshard(storage: RedisStorage, target: int) -> ReshardCheck:
    """check_reshard, then, when ready, switch the prefix to ``target`` shards: the paused
    queues are paused on every shard of the new layout, then the recorded layout becomes
    ``target`` (from then on, processes with the old REDIS_SHARDS are refused and those with
    ``target`` start). Returns the check; nothing is changed unless it is ready."""
    check = check_reshard(storage, target)
    if not check.ready:
        return check
    layout = ShardLayout(storage.key_prefix, target)
    pipe = storage.client.pipeline(transaction=False)
    for prefix in layout.prefixes:
        for queue in sorted(check.paused):
            pipe.sadd(prefix + "queues:paused", queue)
    pipe.set(layout_key(storage.key_prefix), str(target))
    pipe.execute()
    return check
