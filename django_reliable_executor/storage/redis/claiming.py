"""The worker's fetching on the Redis storage: claim.lua, blocking until there is work, leases."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import time
from collections.abc import Collection, Sequence

from ...core.queries import ClaimRequest
from ...core.records import Claim
from ...core.states import TaskStatus
from .access import RedisAccess, guarded
from .codec import claimed, micros, text
from .sharding import CONTROL_SHARD, directory_of
from .waiting import ShardWaiters

# A claim raises the task's token by a random step up to this: a claim lost in a failover and
# the next claim of the task then hold different tokens (2**32 steps stay far below 2**63).
TOKEN_STEP_MAX = 2**32
BLOCK_MAX_SECONDS = 5.0  # longest blocking pop; the worker simply waits again
# Sharded: an idle worker claims on each shard it serves at least this often, token or not (a
# token taken by a worker that died before claiming is the one wake nothing sends again).
SWEEP_SECONDS = 10.0


class Claiming(RedisAccess):
    """claim, wait_for_work, wake and heartbeat: the ready lists, the wake token idle workers
    block on, and the leases of the claims."""

    @guarded
    def _claim(self, request: ClaimRequest) -> list[Claim]:
        if not self.sharded:
            return self._claim_on(CONTROL_SHARD, request)
        # One claim.lua per shard of the queues, in turn, until the limit is reached: priority
        # order is exact within a shard, the turn decides between shards. A queue's tasks are
        # on its own shard and, those of limited names, on their names' home shards.
        claims: list[Claim] = []
        # After an idle wait, only the shards it found may have work (see _quiet_after).
        quiet = self._idle.quiet
        groups = sorted(
            (shard, queues)
            for shard, queues in self._serving(request.queues).items()
            if not quiet.issuperset((shard, queue) for queue in queues)
        )
        if not groups:
            return claims
        turn = self._claim_turn % len(groups)
        self._claim_turn += 1
        # fair_limit bounds the fair names' tasks of the whole claim, whatever their shards
        fair = self.flow_limits.fair() if request.fair_limit is not None else frozenset()
        for shard, queues in groups[turn:] + groups[:turn]:
            limit = request.limit - len(claims)
            if limit <= 0:
                break
            started = sum(1 for claim in claims if claim.task.status is TaskStatus.RUNNING)
            fair_limit = request.fair_limit
            if fair_limit is not None:
                fair_limit = max(fair_limit - sum(c.task.task_name in fair for c in claims), 0)
            part = dataclasses.replace(
                request,
                queues=tuple(queues),
                limit=limit,
                start=max(request.start - started, 0),
                fair_limit=fair_limit,
            )
            claims += self._claim_on(shard, part)
        if claims:  # busy again: every shard is claimed from until the next idle wait
            self._idle.quiet = frozenset()
        return claims

    def _claim_on(self, shard: int, request: ClaimRequest) -> list[Claim]:
        """claim.lua on one shard, for the request's queues (all of that shard)."""
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=request.lease_seconds))
        step = random.randint(1, TOKEN_STEP_MAX)
        if self.sharded:
            self._idle.claimed_at[shard] = time.monotonic()
        reply = self._run(
            "claim",
            request.worker_id,
            lease_until,
            request.limit,
            step,
            request.start,
            *request.queues,
            *_limit_args(request, self.flow_limits.fair()),
            now=now,
            shard=shard,
        )
        next_due = text(reply[0])
        # Redis prints a score past 2**53 (a dependent's far-future run at) in exponent form.
        due = (int(next_due) if next_due.isdigit() else int(float(next_due))) if next_due else None
        for queue in request.queues:  # the earliest of the call's queues: at worst too early
            self._next_due[shard, queue] = due
        claims = [
            claimed(text(reply[i]), reply[i + 1], now, shard) for i in range(1, len(reply), 2)
        ]
        foreign = [c for c in claims if directory_of(c.task.task_id, self.layout.shards) != shard]
        if foreign:  # a given id stored off its directory shard: noted for the heartbeats
            with self._held_lock:
                self._held_on.update((claim.task.task_id, shard) for claim in foreign)
        return claims

    @guarded
    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a submit (or a hand-back) wakes this queue, the next scheduled task of
        these queues is due, or ``timeout`` seconds pass. True when woken by a token."""
        served = set(queues)
        dues = [due for (_, queue), due in self._next_due.items() if queue in served]
        next_due = min((d for d in dues if d is not None), default=None)
        if next_due is not None:
            until_due = (next_due - int(micros(self.clock.now()))) / 1e6
            if until_due <= 0:
                if self.sharded:
                    self._idle.quiet = self._quiet_after(queues, set())
                return False
            timeout = min(timeout, until_due)
        # Never 0 ("forever" to BLPOP), never near the client's socket timeout.
        timeout = min(max(timeout, 0.001), BLOCK_MAX_SECONDS)
        if not self.sharded:
            keys = [self.p + "wake:" + queue for queue in queues]
            return self.client.blpop(keys, timeout=timeout) is not None
        groups = {
            shard: [self.prefixes[shard] + "wake:" + queue for queue in names]
            for shard, names in self._serving(queues).items()
        }
        if len(groups) == 1 and self._waiters is None:  # one shard: its BLPOP on this thread
            ((shard, keys),) = groups.items()
            woken = {shard} if self.client.blpop(keys, timeout=timeout) is not None else set()
        else:
            # (once waiters exist, every wait goes through them: a pop of theirs still under
            # way may take the next token)
            if self._waiters is None:
                self._waiters = ShardWaiters(self.client, len(self.prefixes))
            woken = self._waiters.wait(groups, timeout)
        self._idle.quiet = self._quiet_after(queues, woken)
        return bool(woken)

    def _serving(self, queues: Sequence[str]) -> dict[int, list[str]]:
        """Sharded: ``queues`` by the shards that may hold their tasks (_queue_shards: its
        own, and the home shards of the limited names), each group in the given order. A
        worker's own wake key is on its own shard only."""
        homes = self._home_shards()
        groups: dict[int, list[str]] = {}
        for queue in queues:
            own = [self.layout.shard_of(queue)]
            for shard in own if _private(queue) else self._queue_shards(queue, homes):
                groups.setdefault(shard, []).append(queue)
        return groups

    def _quiet_after(self, queues: Sequence[str], woken: set[int]) -> frozenset[tuple[int, str]]:
        """The (shard, queue) pairs an idle wait that ends now leaves with no work to claim:
        those of the shards without a token (``woken``: the shards with one) whose next
        scheduled task, as their last claim saw it, is not due yet, and that were claimed
        within SWEEP_SECONDS.

        Every change that makes a task claimable pushes a token to its queue (submit, a retry,
        a hand-back, a recovered or released lease, a slot freed under max_concurrency, a
        resume, a schedule's fire) but one: a scheduled task (delayed, a retry's backoff, held
        back by rate_limit) coming due. Its time is in the claim's reply (``_next_due``), so
        its queue is not quiet from then on; one submitted after this worker's last claim of
        the queue is promoted, with a token, by the master's next round."""
        now = int(micros(self.clock.now()))
        since = time.monotonic() - SWEEP_SECONDS
        quiet: list[tuple[int, str]] = []
        for shard, names in self._serving(queues).items():
            if shard in woken or self._idle.claimed_at.get(shard, since) <= since:
                continue
            dues = [self._next_due.get((shard, name), now) for name in names if not _private(name)]
            if any(due is not None and due <= now for due in dues):
                continue
            quiet += [(shard, name) for name in names]
        return frozenset(quiet)

    @guarded
    def wake(self, queues: Sequence[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            key = self._queue_prefix(queue) + "wake:" + queue
            pipe.lpush(key, "1")
            pipe.ltrim(key, 0, 0)
        pipe.execute()


def _limit_args(request: ClaimRequest, fair: Collection[str]) -> list[object]:
    """claim.lua's ARGV after the queues (never empty, so '' ends them): '' and the name, cap
    pairs, '' and the name, count, log window (µs) triples, '' and the name, cap per key
    pairs, '' and the fair limit (at most that many tasks of the names in ``fair``, the names
    fair now, which follow it: a task keeps its round once its name loses fairness, but no
    longer counts); each part left out when it and every later one are empty."""
    parts: list[list[object]] = [
        [item for name, cap in request.name_limits.items() for item in (name, int(cap))],
        [
            item
            for name, rate in request.rate_limits.items()
            for item in (name, rate.count, round(rate.log_window_seconds * 1e6))
        ],
        [item for name, cap in request.key_limits.items() for item in (name, int(cap))],
        [] if request.fair_limit is None else [int(request.fair_limit), *sorted(fair)],
    ]
    while parts and not parts[-1]:
        parts.pop()
    return [item for part in parts for item in ("", *part)]


def _private(key: str) -> bool:
    """A wake key of one worker's own (fetching.py: a slot of a limited queue freed), not a
    queue: never claimed, so it has no due time."""
    return key.startswith("_worker:")
