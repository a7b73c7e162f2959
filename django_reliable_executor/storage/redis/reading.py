"""Reading tasks from the Redis storage: get, list, count, has_work."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from ...records import TaskInfo
from ...states import TERMINAL_STATUSES, TaskStatus
from .access import LIVE, READ_CHUNK, WAITING, RedisAccess, guarded
from .codec import micros, text, to_info


class Reading(RedisAccess):
    """Queries only; nothing here writes."""

    # -- reading --------------------------------------------------------------------------
    @guarded
    def get(self, task_id: str) -> TaskInfo | None:
        values = self.client.hgetall(self._tkey(task_id))
        if not values:
            return None
        return to_info(task_id, {text(k): text(v) for k, v in values.items()})

    @guarded
    def get_many(self, task_ids: Sequence[str]) -> dict[str, TaskInfo]:
        found = self._read_many(list(dict.fromkeys(task_ids)))
        return {task_id: to_info(task_id, values) for task_id, values in found.items()}

    def _queues(self) -> list[str]:
        return sorted(text(queue) for queue in self.client.smembers(self.p + "queues"))

    def _candidate_ids(self, status: TaskStatus | None, queue: str | None) -> set[str]:
        """Ids of every task that may match: read from the indexes its status lives in."""
        ids: set[str] = set()
        want_waiting = status is None or status.value in WAITING
        if status is None or status.value in LIVE:
            ids.update(text(i) for i in self.client.zrange(self.p + "leases", 0, -1))
        if status is None or status in TERMINAL_STATUSES:
            ids.update(text(i) for i in self.client.zrange(self.p + "finished", 0, -1))
        if want_waiting:
            queues = [queue] if queue is not None else self._queues()
            pipe = self.client.pipeline(transaction=False)
            for name in queues:
                pipe.zrange(self.p + "prio:" + name, 0, -1)
                pipe.zrange(self.p + "sched:" + name, 0, -1)
            replies = pipe.execute()
            pipe = self.client.pipeline(transaction=False)
            for name, priorities, scheduled in zip(
                queues, replies[::2], replies[1::2], strict=True
            ):
                ids.update(text(i) for i in scheduled)
                for priority in priorities:
                    pipe.lrange(f"{self.p}ready:{name}:{text(priority)}", 0, -1)
            for ready in pipe.execute():
                ids.update(text(i) for i in ready)
        return ids

    @guarded
    def list(
        self,
        *,
        status: TaskStatus | None = None,
        task_name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[TaskInfo]:
        """Newest first. Reads the ids of every task in the statuses asked for (Redis keeps
        no index by creation time: it would cost more memory per task than the task itself)."""
        if limit <= 0:
            return []
        status = TaskStatus(status) if status is not None else None
        ids = sorted(self._candidate_ids(status, queue))
        rows: list[tuple[int, str]] = []
        for start in range(0, len(ids), READ_CHUNK):
            chunk = ids[start : start + READ_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for task_id in chunk:
                pipe.hmget(self._tkey(task_id), "c", "s", "n", "q")
            for task_id, (created, state, name, name_queue) in zip(
                chunk, pipe.execute(), strict=True
            ):
                if created is None:
                    continue  # purged meanwhile
                if status is not None and text(state) != status.value:
                    continue
                if task_name is not None and text(name) != task_name:
                    continue
                if queue is not None and text(name_queue) != queue:
                    continue
                rows.append((int(created), task_id))
        rows.sort(reverse=True)
        page = [task_id for _, task_id in rows[offset : offset + limit]]
        found = self._read_many(page)
        return [to_info(task_id, found[task_id]) for task_id in page if task_id in found]

    @guarded
    def count(self, queue: str | None = None) -> dict[TaskStatus, int]:
        counts = {status: 0 for status in TaskStatus}
        for key, value in self.client.hgetall(self.p + "counts").items():
            state, _, name = text(key).partition(":")
            if queue is None or name == queue:
                counts[TaskStatus(state)] += int(value)
        return counts

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
