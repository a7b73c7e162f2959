"""Durable steps on the Redis storage: one hash per task, ``P steps:<id>`` on the task's shard,
step name -> "<order> <finished at> <result JSON>", written by step.lua."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ...core.records import Claim
from ...core.serialization import Encoded
from .access import RedisAccess, guarded
from .codec import micros, stored_steps


class Steps(RedisAccess):
    """record_step (step.lua) and step_results."""

    @guarded
    def record_step(
        self,
        claim: Claim,
        name: str,
        result: Encoded,
        lease_seconds: float,
        renew_lease: bool = True,
    ) -> bool:
        # step.lua renews the lease whatever renew_lease says: in the same script, for free.
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        stored = self._run(
            "step",
            claim.task_id,
            claim.task.worker_id or "",
            claim.token,
            lease_until,
            name,
            result.text,
            now=now,
            shard=claim.shard,
        )
        return bool(int(stored))

    @guarded
    def step_results(self, task_id: str) -> dict[str, Any]:
        shard = self._task_shard(task_id)
        values = self.client.hgetall(self.prefixes[shard] + "steps:" + task_id)
        return {name: json.loads(result) for name, _, result in stored_steps(values)}
