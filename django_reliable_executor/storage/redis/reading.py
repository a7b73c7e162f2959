"""Reading tasks from Redis storage: get, counts, oldest due tasks, endings per minute, has_work,
and the flow limits in use."""

from __future__ import annotations

import builtins
import datetime as dt
from collections import Counter
from collections.abc import Mapping, Sequence

from ...core.minute_counts import MinuteCounts, minute_start
from ...core.queries import KeyUse, RateUse, key_uses
from ...core.rate_limits import RateLimit
from ...core.records import TaskInfo, copy_with
from ...core.states import DEAD_LETTER_STATUSES, LIVE_STATUSES, TaskStatus
from .access import LIVE, RedisAccess, guarded
from .codec import fair_member, from_micros, micros, text, to_info
from .reservations import entry_holder
from .sharding import unique_home

# How many of the first tasks of each fair set (in round order) oldest_due reads.
FAIR_HEADS = 100
# The fields of a ``tput:<minute>`` hash the chart reads: the statuses it shows, and retries.
RETRIED = "RETRIED"
ENDING_FIELDS = [
    TaskStatus.COMPLETED.value,
    *sorted(s.value for s in DEAD_LETTER_STATUSES),
    RETRIED,
]
# A ``tput:<minute>`` hash's field of the tasks of one queue completed in the minute:
# ``c:<queue>``.
COMPLETED_IN = "c:"


class Reading(RedisAccess):
    """Queries only; nothing here writes."""

    # -- reading --------------------------------------------------------------------------
    @guarded
    def get_many(self, task_ids: Sequence[str]) -> dict[str, TaskInfo]:
        ids = list(dict.fromkeys(task_ids))
        found: dict[str, dict[str, str]] = {}
        infos: dict[str, TaskInfo] = {}
        for shard in range(len(self.prefixes)):  # each shard holds its queues' tasks
            here = self._read_many([i for i in ids if i not in found], shard=shard)
            found.update(here)
            infos.update((task_id, to_info(task_id, values)) for task_id, values in here.items())
            for task_id, steps in self._steps_of(here, shard).items():
                infos[task_id] = copy_with(infos[task_id], steps=steps)
        return infos

    @guarded
    def dependents_of(self, task_id: str, limit: int | None = None) -> list[str]:
        key = self.prefixes[self._task_shard(task_id)] + "deps:" + task_id
        if limit is None:
            members = self.client.smembers(key)
        else:
            # SSCAN a page at a time until ``limit`` are read: a set of 100,000 costs a few
            # pages, not all of it (SMEMBERS); which ones come first is the set's own order.
            members, cursor = set(), 0
            while len(members) < limit:
                cursor, page = self.client.sscan(key, cursor, count=max(limit - len(members), 10))
                members.update(page)
                if not cursor:
                    break
        # A dependent of another shard is kept as "<shard> <id>" (task ids hold no space).
        found = sorted(text(member).rpartition(" ")[2] for member in members)
        return found if limit is None else found[: max(limit, 0)]

    @guarded
    def count_dependents(self, task_id: str) -> int:
        return int(self.client.scard(self.prefixes[self._task_shard(task_id)] + "deps:" + task_id))

    @guarded
    def count(self, queue: str | None = None) -> dict[TaskStatus, int]:
        counts = {status: 0 for status in TaskStatus}
        for key, value in self._counts().items():
            state, _, name = key.partition(":")
            if queue is None or name == queue:
                counts[TaskStatus(state)] += int(value)
        return counts

    @guarded
    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]:
        counts: dict[str, dict[TaskStatus, int]] = {}
        for key, value in self._counts().items():
            state, _, queue = key.partition(":")
            queue_counts = counts.setdefault(queue, {status: 0 for status in TaskStatus})
            queue_counts[TaskStatus(state)] += int(value)
        return {q: c for q, c in sorted(counts.items()) if any(c.values())}

    def _counts(self) -> dict[str, int]:
        """Every shard's ``counts`` together: "<STATUS>:<queue>" -> tasks."""
        if not self.sharded:
            return {text(k): int(v) for k, v in self.client.hgetall(self.p + "counts").items()}
        return self._sum_hashes("counts")

    @guarded
    def oldest_due(self, queue: str | None = None) -> dt.datetime | None:
        due = self._oldest_due_micros([queue] if queue is not None else self._queues())
        return from_micros(min(due.values())) if due else None

    @guarded
    def oldest_due_by_queue(self) -> dict[str, dt.datetime]:
        due = self._oldest_due_micros(self._queues())
        return {queue: from_micros(run_at) for queue, run_at in sorted(due.items())}

    def _oldest_due_micros(self, queues: Sequence[str]) -> dict[str, int]:
        """Per queue, the earliest run_at among the heads of its ready lists (each list is in
        the order tasks became ready), the first FAIR_HEADS tasks of its fair sets (in round
        order: a key's oldest task is about where the claims are, so with more keys than
        that due, an older task may be missed) and its scheduled tasks already due but not
        promoted yet: three pipelined round trips whatever the number of tasks (the fourth
        reads the fnames of queues with fair sets)."""
        now = micros(self.clock.now())
        # Each queue on every shard that may hold its tasks (sharded: the home shards too).
        homes = self._home_shards() if self.sharded else frozenset()
        places = [
            (name, self.prefixes[shard])
            for name in queues
            for shard in self._queue_shards(name, homes)
        ]
        pipe = self.client.pipeline(transaction=False)
        for name, prefix in places:
            pipe.zrange(prefix + "prio:" + name, 0, -1)
            pipe.zrangebyscore(
                prefix + "sched:" + name, "-inf", now, start=0, num=1, withscores=True
            )
            pipe.zrange(prefix + "fprio:" + name, 0, -1)
        replies = pipe.execute()
        fair_priorities = zip(places, replies[2::3], strict=True)
        fair = self._fair_sets([(q, p, found) for (q, p), found in fair_priorities])
        due: dict[str, int] = {}

        def seen(queue: str, run_at: int) -> None:
            due[queue] = min(due.get(queue, run_at), run_at)

        for (name, _), scheduled in zip(places, replies[1::3], strict=True):
            for _, score in scheduled:
                seen(name, int(score))
        pipe = self.client.pipeline(transaction=False)
        lists: list[tuple[str, str]] = []
        for (name, prefix), priorities in zip(places, replies[::3], strict=True):
            for priority in priorities:
                pipe.lindex(f"{prefix}ready:{name}:{text(priority)}", 0)
                lists.append((name, prefix))
        for _, key in fair:
            pipe.zrange(key, 0, FAIR_HEADS - 1)
        found = pipe.execute()
        heads = [
            (name, prefix, text(head))
            for (name, prefix), head in zip(lists, found[: len(lists)], strict=True)
            if head is not None
        ]
        for (index, _), firsts in zip(fair, found[len(lists) :], strict=True):
            for member in firsts:  # (a fair set's member tells its run at)
                run_at = fair_member(member)[0]
                if run_at <= int(now):
                    seen(places[index][0], run_at)
        pipe = self.client.pipeline(transaction=False)
        for _, prefix, head in heads:
            pipe.hget(prefix + "t:" + head, "r")
        for (name, _, _), run_at in zip(heads, pipe.execute(), strict=True):
            # (a head due later after all: a debounced submit joined it where it waited, and
            # the claim that pops it schedules it, see claim.lua)
            if run_at is not None and int(run_at) <= int(now):
                seen(name, int(run_at))
        return due

    def _minute_sums(self, fields: Sequence[str], first: int, last: int) -> dict[int, list[int]]:
        """``fields`` of the ``tput:<minute>`` hashes the scripts count endings in (see
        _common.lua's count_ending), summed over the shards, for each minute ``first..last``
        with any: one pipelined HMGET per minute and shard."""
        minutes = range(first, last + 1)
        pipe = self.client.pipeline(transaction=False)
        for minute in minutes:
            for prefix in self.prefixes:  # each shard counts the endings of its tasks
                pipe.hmget(f"{prefix}tput:{minute}", fields)
        replies = pipe.execute()
        shards = len(self.prefixes)
        sums: dict[int, list[int]] = {}
        for index, minute in enumerate(minutes):
            n = [0] * len(fields)
            for values in replies[index * shards : (index + 1) * shards]:
                for i, value in enumerate(values):
                    n[i] += int(value) if value is not None else 0
            if any(n):
                sums[minute] = n
        return sums

    @guarded
    def _minute_counts(self, first: int, last: int) -> dict[int, MinuteCounts]:
        counted: dict[int, MinuteCounts] = {}
        for minute, values in self._minute_sums(ENDING_FIELDS, first, last).items():
            n = dict(zip(ENDING_FIELDS, values, strict=True))
            counted[minute] = MinuteCounts(
                minute=minute_start(minute),
                completed=n[TaskStatus.COMPLETED.value],
                failed=sum(n[s.value] for s in DEAD_LETTER_STATUSES),
                retried=n[RETRIED],
            )
        return counted

    @guarded
    def _completed_by_queue(
        self, queues: builtins.list[str], first: int, last: int
    ) -> dict[str, dict[int, int]]:
        """The ``c:<queue>`` fields of the ``tput:<minute>`` hashes, by queue and minute."""
        fields = [COMPLETED_IN + queue for queue in queues]
        counted: dict[str, dict[int, int]] = {}
        for minute, values in self._minute_sums(fields, first, last).items():
            for queue, value in zip(queues, values, strict=True):
                if value:
                    counted.setdefault(queue, {})[minute] = value
        return counted

    @guarded
    def has_work(self, queues: Sequence[str], horizon_seconds: float) -> bool:
        horizon = micros(self.clock.now() + dt.timedelta(seconds=horizon_seconds))
        homes = self._home_shards() if self.sharded else frozenset()
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            for shard in self._queue_shards(queue, homes):  # sharded: the home shards too
                prefix = self.prefixes[shard]
                pipe.hmget(prefix + "counts", [f"{state}:{queue}" for state in LIVE])
                pipe.zcount(prefix + "sched:" + queue, "(" + horizon, "+inf")
        replies = pipe.execute()
        unfinished = sum(int(v) for counts in replies[::2] for v in counts if v is not None)
        return unfinished > sum(replies[1::2])

    @guarded
    def unique_holder(self, unique_key: str) -> TaskInfo | None:
        home = unique_home(unique_key, self.layout.shards)
        held = self.client.get(self.prefixes[home] + "u:" + unique_key)
        if held is None:
            return None
        until, task_id = text(held).split(" ", 1)
        if from_micros(until) <= self.clock.now():
            return None
        if " " in task_id:  # sharded: reserved for a task of another shard
            holder, _settled = entry_holder(self, text(held), home, None)
            return holder
        holder = self.get(task_id)
        if holder is None or (holder.status not in LIVE_STATUSES and not holder.handler_running):
            return None
        return holder


def bucket(name: str, rate_key: str) -> str:
    """The log's name part, as rate_bucket in _common.lua (Lua counts bytes)."""
    return f"{len(name.encode())}:{name}:{rate_key}"


class RateReading(RedisAccess):
    """rate_use: the logs read in two pipelined round trips; key_use: the held counts per key
    in one."""

    @guarded
    def key_use(self, limits: Mapping[str, int]) -> builtins.list[KeyUse]:
        # heldkey:<name> (lua/_common.lua) on every shard: a keyed name's tasks live on its
        # home shard, but one stored by a submitter not told of the cap is on its queue's.
        names = list(limits)
        if not names:
            return []
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            for name in names:
                pipe.hgetall(prefix + "heldkey:" + name)
        held: Counter[tuple[str, str]] = Counter()
        for i, counts in enumerate(pipe.execute()):
            for key, n in counts.items():
                held[names[i % len(names)], text(key)] += int(n)
        return key_uses(limits, [(name, key, n) for (name, key), n in held.items()])

    @guarded
    def rate_use(self, limits: Mapping[str, RateLimit]) -> builtins.list[RateUse]:
        # Each shard logs the claims made on it (a name claimed on k shards has k logs): the
        # shards' figures added, the busiest key the busiest of one shard.
        parts = [self._rate_use_on(limits, prefix) for prefix in self.prefixes]
        if len(parts) == 1:
            return parts[0]
        return [
            RateUse(
                uses[0].task_name,
                uses[0].limit,
                sum(use.started for use in uses),
                max(use.busiest for use in uses),
                sum(use.keys for use in uses),
                sum(use.held_back for use in uses),
            )
            for uses in zip(*parts, strict=True)
        ]

    def _rate_use_on(self, limits: Mapping[str, RateLimit], prefix: str) -> builtins.list[RateUse]:
        now = int(micros(self.clock.now()))
        names = list(limits)
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            short = f"{len(name.encode())}:{name}"
            window = round(limits[name].window_seconds * 1e6)
            pipe.zrangebyscore(prefix + "ratekeys:" + short, now - window, "+inf")
            pipe.zcount(prefix + "ratewait:" + short, f"({now}", "+inf")
        replies = pipe.execute()
        pipe = self.client.pipeline(transaction=False)
        keys_of = {}
        for i, name in enumerate(names):
            keys_of[name] = [k.decode() if isinstance(k, bytes) else k for k in replies[2 * i]]
            window = round(limits[name].window_seconds * 1e6)
            for key in keys_of[name]:
                pipe.zcount(prefix + "rate:" + bucket(name, key), f"({now - window}", "+inf")
        counts = iter(pipe.execute())
        uses = []
        for i, name in enumerate(names):
            recent = [int(next(counts)) for _ in keys_of[name]]
            uses.append(
                RateUse(
                    name,
                    limits[name],
                    sum(recent),
                    max(recent, default=0),
                    sum(1 for n in recent if n),
                    int(replies[2 * i + 1]),
                )
            )
        return uses
