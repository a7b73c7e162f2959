"""Reading tasks from the Redis storage: get, counts, the oldest due task, has_work."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from ...records import TaskInfo
from ...states import TaskStatus
from .access import LIVE, RedisAccess, guarded
from .codec import from_micros, micros, text, to_info


class Reading(RedisAccess):
    """Queries only; nothing here writes."""

    # -- reading --------------------------------------------------------------------------
    @guarded
    def get_many(self, task_ids: Sequence[str]) -> dict[str, TaskInfo]:
        found = self._read_many(list(dict.fromkeys(task_ids)))
        return {task_id: to_info(task_id, values) for task_id, values in found.items()}

    @guarded
    def dependents_of(self, task_id: str) -> list[str]:
        return sorted(text(member) for member in self.client.smembers(self.p + "deps:" + task_id))

    @guarded
    def count(self, queue: str | None = None) -> dict[TaskStatus, int]:
        counts = {status: 0 for status in TaskStatus}
        for key, value in self.client.hgetall(self.p + "counts").items():
            state, _, name = text(key).partition(":")
            if queue is None or name == queue:
                counts[TaskStatus(state)] += int(value)
        return counts

    @guarded
    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]:
        counts: dict[str, dict[TaskStatus, int]] = {}
        for key, value in self.client.hgetall(self.p + "counts").items():
            state, _, queue = text(key).partition(":")
            queue_counts = counts.setdefault(queue, {status: 0 for status in TaskStatus})
            queue_counts[TaskStatus(state)] += int(value)
        return {q: c for q, c in sorted(counts.items()) if any(c.values())}

    @guarded
    def oldest_due(self, queue: str | None = None) -> dt.datetime | None:
        """The earliest run_at among the heads of the ready lists (each list is in the order
        tasks became ready) and the scheduled tasks already due but not promoted yet."""
        now = micros(self.clock.now())
        queues = [queue] if queue is not None else self._queues()
        pipe = self.client.pipeline(transaction=False)
        for name in queues:
            pipe.zrange(self.p + "prio:" + name, 0, -1)
            pipe.zrangebyscore(
                self.p + "sched:" + name, "-inf", now, start=0, num=1, withscores=True
            )
        replies = pipe.execute()
        candidates = [int(score) for due in replies[1::2] for _, score in due]
        pipe = self.client.pipeline(transaction=False)
        for name, priorities in zip(queues, replies[::2], strict=True):
            for priority in priorities:
                pipe.lindex(f"{self.p}ready:{name}:{text(priority)}", 0)
        heads = [text(head) for head in pipe.execute() if head is not None]
        pipe = self.client.pipeline(transaction=False)
        for head in heads:
            pipe.hget(self._tkey(head), "r")
        candidates += [int(run_at) for run_at in pipe.execute() if run_at is not None]
        return from_micros(min(candidates)) if candidates else None

    @guarded
    def has_work(self, queues: Sequence[str], horizon_seconds: float) -> bool:
        horizon = micros(self.clock.now() + dt.timedelta(seconds=horizon_seconds))
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            pipe.hmget(self.p + "counts", [f"{state}:{queue}" for state in LIVE])
            pipe.zcount(self.p + "sched:" + queue, "(" + horizon, "+inf")
        replies = pipe.execute()
        unfinished = sum(int(v) for counts in replies[::2] for v in counts if v is not None)
        return unfinished > sum(replies[1::2])
