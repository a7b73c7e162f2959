"""Batches on the Redis storage: a hash per batch whose counters each member's ending keeps
(settle_batch in lua/_batches.lua, or its message from another shard); see batches.py."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence

from ...core.batches import BatchInfo, NewBatch, batch_info
from ...core.records import NewTask, TaskInfo
from .access import RedisAccess, guarded
from .codec import fields, from_micros, micros, submit_args, text
from .sharding import CONTROL_SHARD


class Batches(RedisAccess):
    """open_batch and seal_batch (one script each), add_to_batch (submit.lua, whose store
    counts each member stored in its batch's total), get_batch, purge_batches."""

    @guarded
    def open_batch(self, batch: NewBatch) -> bool:
        self.check_layout()
        callbacks = (batch.on_complete, batch.on_success)
        fair = self.flow_limits.fair()
        packed = ["" if task is None else json.dumps(submit_args(task, fair)) for task in callbacks]
        packed.append(batch.generation)
        # Sharded: a batch lives on the control shard; a callback of another shard's queue is
        # sent there to be stored when the batch finishes (batch_open.lua keeps its shard).
        if self.sharded:
            homes = self.flow_limits.homes()
            shards = [
                None if task is None else self._store_shard(task.task_name, task.queue, homes)
                for task in callbacks
            ]
            packed += [
                str(shard) if shard is not None and shard != CONTROL_SHARD else ""
                for shard in shards
            ]
        info = json.dumps(batch.callbacks_json())
        opened = self._run("batch_open", batch.batch_id, info, *packed, now=batch.created_at)
        return bool(int(opened))

    def add_to_batch(self, batch_id: str, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        assert all(task.batch_id == batch_id for task in tasks)
        results = self.enqueue(tasks)
        if self.sharded:
            # Members of other shards were stored counted nowhere: counted in the batch's total
            # now, before the batch is sealed (their endings, maybe first, come as messages).
            homes = self.flow_limits.homes()
            joined = [
                value
                for info, created in results
                if created and self._store_shard(info.task_name, info.queue, homes) != CONTROL_SHARD
                for value in (info.task_id, micros(info.created_at))
            ]
            if joined:
                self._run("batch_join", batch_id, *joined)
        return results

    @guarded
    def existing_ids(self, task_ids: Sequence[str]) -> list[str]:
        if self.sharded:  # tasks of several shards: no one EXISTS for the lot
            return list(self.get_many(task_ids))
        # One EXISTS for the lot: a batch's members are new, so the count is nearly always 0.
        if not task_ids or not self.client.exists(*[self._tkey(i) for i in task_ids]):
            return []
        return list(self.get_many(task_ids))

    @guarded
    def seal_batch(self, batch_id: str) -> BatchInfo:
        values = fields(self._run("batch_seal", batch_id))
        if not values:
            raise LookupError(f"no batch {batch_id!r}")
        return _info(batch_id, values)

    @guarded
    def get_batch(self, batch_id: str) -> BatchInfo | None:
        raw = self.client.hgetall(self.p + "b:" + batch_id)
        values = {text(k): text(v) for k, v in raw.items()}
        return _info(batch_id, values) if values else None

    @guarded
    def purge_batches(self, finished_before: dt.datetime, limit: int) -> int:
        cutoff = micros(finished_before)
        ids = self.client.zrangebyscore(
            self.p + "batches:finished", "-inf", "(" + cutoff, start=0, num=limit
        )
        return int(self._run("batch_purge", cutoff, *ids)) if ids else 0


def _info(batch_id: str, values: dict[str, str]) -> BatchInfo:
    counts = {
        "total": int(values.get("n", 0)),
        "completed": int(values.get("ok", 0)),
        "failed": int(values.get("ko", 0)),
        "cancelled": int(values.get("cx", 0)),
    }
    finished = values.get("f")
    return batch_info(
        batch_id,
        counts,
        from_micros(values["c"]),
        from_micros(finished) if finished else None,
        values.get("sl") == "1",
        json.loads(values.get("cb") or "{}"),
    )
