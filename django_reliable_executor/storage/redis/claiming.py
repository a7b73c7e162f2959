"""The worker's fetching on the Redis storage: claim.lua, and blocking until there is work."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Sequence

from ...records import Claim, ClaimRequest
from ...states import TaskStatus
from .access import RedisAccess, guarded
from .codec import claimed, micros, text
from .sharding import CONTROL_SHARD
from .waiting import ShardWaiters

# A claim raises the task's token by a random step up to this: a claim lost in a failover and
# the next claim of the task then hold different tokens (2**32 steps stay far below 2**63).
TOKEN_STEP_MAX = 2**32
BLOCK_MAX_SECONDS = 5.0  # longest blocking pop; the worker simply waits again


class Claiming(RedisAccess):
    """claim, wait_for_work and wake: the ready lists, and the wake token idle workers block on."""

    @guarded
    def _claim(self, request: ClaimRequest) -> list[Claim]:
        if not self.sharded:
            return self._claim_on(CONTROL_SHARD, request)
        # One claim.lua per shard of the queues, in turn, until the limit is reached: priority
        # order is exact within a shard, the turn decides between shards.
        claims: list[Claim] = []
        groups = sorted(self.layout.by_shard(request.queues).items())
        turn = self._claim_turn % len(groups)
        self._claim_turn += 1
        for shard, queues in groups[turn:] + groups[:turn]:
            limit = request.limit - len(claims)
            if limit <= 0:
                break
            started = sum(1 for claim in claims if claim.task.status is TaskStatus.RUNNING)
            part = dataclasses.replace(
                request, queues=tuple(queues), limit=limit, start=max(request.start - started, 0)
            )
            claims += self._claim_on(shard, part)
        return claims

    def _claim_on(self, shard: int, request: ClaimRequest) -> list[Claim]:
        """claim.lua on one shard, for the request's queues (all of that shard)."""
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=request.lease_seconds))
        step = random.randint(1, TOKEN_STEP_MAX)
        caps: list[object] = []
        if request.name_limits or request.rate_limits:
            caps = [""]  # after the queues (never empty): the name, cap pairs
            for name, cap in request.name_limits.items():
                caps += [name, int(cap)]
        if request.rate_limits:
            caps.append("")  # then the name, count, log window (µs) triples
            for name, rate in request.rate_limits.items():
                caps += [name, rate.count, round(rate.log_window_seconds * 1e6)]
        reply = self._run(
            "claim",
            request.worker_id,
            lease_until,
            request.limit,
            step,
            request.start,
            *request.queues,
            *caps,
            now=now,
            shard=shard,
        )
        next_due = text(reply[0])
        # Redis prints a score past 2**53 (a dependent's far-future run at) in exponent form.
        due = (int(next_due) if next_due.isdigit() else int(float(next_due))) if next_due else None
        for queue in request.queues:  # the earliest of the call's queues: at worst too early
            self._next_due[queue] = due
        return [claimed(text(reply[i]), reply[i + 1], now) for i in range(1, len(reply), 2)]

    @guarded
    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a submit (or a hand-back) wakes this queue, the next scheduled task of
        these queues is due, or ``timeout`` seconds pass. True when woken by a token."""
        dues = [self._next_due.get(queue) for queue in queues]
        next_due = min((d for d in dues if d is not None), default=None)
        if next_due is not None:
            until_due = (next_due - int(micros(self.clock.now()))) / 1e6
            if until_due <= 0:
                return False
            timeout = min(timeout, until_due)
        # Never 0 ("forever" to BLPOP), never near the client's socket timeout.
        timeout = min(max(timeout, 0.001), BLOCK_MAX_SECONDS)
        if not self.sharded:
            keys = [self.p + "wake:" + queue for queue in queues]
            return self.client.blpop(keys, timeout=timeout) is not None
        groups = {
            shard: [self.prefixes[shard] + "wake:" + queue for queue in names]
            for shard, names in self.layout.by_shard(list(queues)).items()
        }
        if len(groups) == 1 and self._waiters is None:  # one shard: its BLPOP on this thread
            (keys,) = groups.values()
            return self.client.blpop(keys, timeout=timeout) is not None
        # (once waiters exist, every wait goes through them: a pop of theirs still under way
        # may take the next token)
        if self._waiters is None:
            self._waiters = ShardWaiters(self.client, len(self.prefixes))
        return self._waiters.wait(groups, timeout)

    @guarded
    def wake(self, queues: Sequence[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            key = self._queue_prefix(queue) + "wake:" + queue
            pipe.lpush(key, "1")
            pipe.ltrim(key, 0, 0)
        pipe.execute()
