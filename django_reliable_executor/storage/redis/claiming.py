"""The worker's fetching on the Redis storage: claim.lua, and blocking until there is work."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Sequence

from ...records import Claim, ClaimRequest
from .access import RedisAccess, guarded
from .codec import claimed, micros, text

# A claim raises the task's token by a random step up to this: a claim lost in a failover and
# the next claim of the task then hold different tokens (2**32 steps stay far below 2**63).
TOKEN_STEP_MAX = 2**32
BLOCK_MAX_SECONDS = 5.0  # longest blocking pop; the worker simply waits again


class Claiming(RedisAccess):
    """claim, wait_for_work and wake: the ready lists, and the wake token idle workers block on."""

    @guarded
    def _claim(self, request: ClaimRequest) -> list[Claim]:
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
        keys = [self.p + "wake:" + queue for queue in queues]
        return self.client.blpop(keys, timeout=timeout) is not None

    @guarded
    def wake(self, queues: Sequence[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            pipe.lpush(self.p + "wake:" + queue, "1")
            pipe.ltrim(self.p + "wake:" + queue, 0, 0)
        pipe.execute()
