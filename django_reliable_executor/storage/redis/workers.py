"""The live-worker registry of the Redis storage: a hash of descriptions, a set of heartbeats."""

from __future__ import annotations

import builtins
import datetime as dt
import json

from ...core.records import WorkerInfo
from .access import RedisAccess, guarded
from .codec import from_micros, micros, text


class Workers(RedisAccess):
    """worker_seen, worker_gone, workers, worker_last_seen, forget_workers: kept fresh by
    heartbeats."""

    @guarded
    def worker_seen(self, worker_id: str, info: dict[str, object]) -> None:
        now = micros(self.clock.now())
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(self.p + "workers", worker_id, json.dumps({**info, "started_at": now}))
        pipe.zadd(self.p + "workers:seen", {worker_id: now})
        pipe.execute()

    @guarded
    def worker_gone(self, worker_id: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.p + "workers", worker_id)
        pipe.zrem(self.p + "workers:seen", worker_id)
        pipe.execute()

    @guarded
    def workers(self) -> builtins.list[WorkerInfo]:
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.p + "workers")
        pipe.zrange(self.p + "workers:seen", 0, -1, withscores=True)
        described, seen = pipe.execute()
        last_seen = {text(worker_id): int(score) for worker_id, score in seen}
        found = []
        for worker_id, raw in sorted((text(k), text(v)) for k, v in described.items()):
            if worker_id not in last_seen:
                continue
            info = json.loads(raw)
            found.append(
                WorkerInfo(
                    worker_id=worker_id,
                    hostname=str(info.get("hostname", "")),
                    pid=int(info.get("pid", 0)),
                    queues=tuple(info.get("queues", ())),
                    started_at=from_micros(info["started_at"]),
                    last_seen_at=from_micros(last_seen[worker_id]),
                )
            )
        return found

    @guarded
    def worker_last_seen(self, worker_id: str) -> dt.datetime | None:
        seen = self.client.zscore(self.p + "workers:seen", worker_id)
        return from_micros(int(seen)) if seen is not None else None

    @guarded
    def forget_workers(self, seen_before: dt.datetime) -> int:
        silent = self._due_ids("workers:seen", seen_before, 1000, inclusive=False)
        if not silent:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.p + "workers", *silent)
        pipe.zrem(self.p + "workers:seen", *silent)
        return int(pipe.execute()[1])
