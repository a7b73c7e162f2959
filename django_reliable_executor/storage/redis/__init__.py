"""RedisStorage: every task in a hash, every state change one atomic Lua script.

Key layout. ``P`` is ``{KEY_PREFIX}:``; the braces make it a Cluster hash tag, so every key
lives in one hash slot and a script may touch any of them. Times are microseconds since the
epoch, written as decimal strings.

``P t:<id>``               HASH, one per task. n name, q queue, p priority, s status, j parameter
                           (JSON), a attempts, b attempts against the current retry budget,
                           k fencing token, rl/ri/rb retry limit/interval/backoff, md max
                           duration (ms), c created, r run at, st started, f finished,
                           d deadline, e last error, o result (JSON), w worker, x cancel
                           requested ("1"), rq nonce of the last worker write (so a write
                           redis-py resends after a lost reply is recognised as done).
                           Fields without a value are absent.
``P ready:<queue>:<prio>`` LIST of task ids ready to run, oldest first (FIFO within a priority).
``P prio:<queue>``         ZSET of the priorities that have a non-empty ready list (claims take
                           the highest first).
``P sched:<queue>``        ZSET of waiting tasks not due yet (delayed, or retrying after a
                           backoff), scored by run at. Claims and submits promote due ones.
``P leases``               ZSET of claimed and running tasks, scored by lease expiry; also of
                           tasks that timed out while running, as long as their holder's lease
                           lasts (the handler may still run; see expire.lua).
``P deadlines``            ZSET of unfinished tasks with a max duration, scored by deadline.
``P finished``             ZSET of terminal tasks, scored by finish time (purge).
``P done:<STATUS>``        ZSET per terminal status, scored by creation time (listing).
``P counts``               HASH "<STATUS>:<queue>" -> number of tasks, kept exact by every script.
``P queues``               SET of every queue that holds a task in any status: purge forgets a
                           queue with its last task (its count fields and wake token too), a
                           submit adds it again (forget_if_empty in _common.lua).
``P wake:<queue>``         LIST holding at most one token: idle workers block on it (BLPOP).
``P held``                 HASH task name -> how many tasks of the name are in the leases (claimed
                           or running), changed only where a task enters or leaves the leases
                           (the lease and unlease helpers of _common.lua); a name at 0 is
                           removed. Claims compare it with the name's max_concurrency.
``P parked:<name>:<prio>`` ZSET of due tasks of a capped name that a claim found at its cap,
                           scored by run at: waiting, out of the ready lists' way. Claims take
                           them from here, in order with the ready lists, while the name has a
                           free slot; a slot freed (unlease), or the promote chore while nothing
                           of the name is held, wakes the queue of the next one.
``P parkprio:<name>``      ZSET of the priorities that have a non-empty parked set of the name.
``P parked``               SET of the task names that have parked tasks.
``P lock:<name>``          STRING "<expiry>:<owner>" with a PX expiry: a named lease.
``P workers``, ``P workers:seen``  HASH worker id -> JSON, ZSET worker id -> last heartbeat.
``P s:<id>``               HASH, one per schedule. n task name, j parameter, ev interval (µs) or
                           cr cron + tz time zone, sa start, m misfire policy, q/p/rl/ri/rb/md
                           the task options it fires with, o origin, pa "1" while paused,
                           nr next run, lr/lt planned time and task id of the latest fire,
                           c created, u updated.
``P schedules``            ZSET of every schedule id, all scored 0 (listing by id).
``P schedules:due``        ZSET of active schedules scored by next run (the master's due scan).
``P schedules:paused``     ZSET of paused schedule ids, scored 0.

A waiting task is in exactly one of a ready list, its queue's schedule, a parked set (of its
name and priority) or (claimed) the leases; a running task is in the leases; a terminal one in
the finished index and its done index (and, timed out while running, in the leases until
its holder's lease ends). ``held`` equals the leased tasks of each name.
Each script in storage/lua/ is a compare-and-set on the status (and the claim's token) it
expects, so a lost race changes nothing. Nothing read back is ever unpickled: parameters and
results are JSON.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import random
from collections.abc import Mapping, Sequence

from ...exceptions import AttemptStillRunningError
from ...records import CancelResult, Claim, NewTask, TaskInfo, Transition, new_info
from ...retries import failure_outcome, timeout_message
from ...serialization import encoded
from ...states import RETRYABLE_BY_HAND, TaskStatus
from .access import guarded
from .chores import Chores
from .codec import claimed, fields, from_micros, micros, nonce, submit_args, text, to_info
from .leases import Leases
from .listing import Listing
from .reading import Reading
from .schedules import Schedules

# A claim raises the task's token by a random step up to this: a claim lost in a failover and
# the next claim of the task then hold different tokens (2**32 steps stay far below 2**63).
TOKEN_STEP_MAX = 2**32
BLOCK_MAX_SECONDS = 5.0  # longest blocking pop; the worker simply waits again
SUBMIT_CHUNK = 500  # tasks per submit script call: long enough to amortise, short enough not
# to hold Redis up (a script blocks every other client while it runs)


class RedisStorage(Schedules, Chores, Reading, Listing, Leases):
    """Tasks in Redis under one key prefix (see the module docstring for the key layout)."""

    #: Idle workers may block in wait_for_work instead of sleeping.
    blocking_wait = True

    # -- submitting -----------------------------------------------------------------------
    @guarded
    def enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        results: list[tuple[TaskInfo, bool]] = []
        for start in range(0, len(tasks), SUBMIT_CHUNK):
            chunk = tasks[start : start + SUBMIT_CHUNK]
            args = [value for task in chunk for value in submit_args(task)]
            replies = self._run("submit", *args)
            for task, reply in zip(chunk, replies, strict=True):
                if reply == 1:
                    results.append((new_info(task), True))
                else:
                    results.append((to_info(task.task_id, fields(reply)), False))
        return results

    # -- the worker's path ----------------------------------------------------------------
    @guarded
    def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        limit: int,
        lease_seconds: float,
        *,
        name_limits: Mapping[str, int] | None = None,
    ) -> list[Claim]:
        if limit <= 0 or not queues:
            return []
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        step = random.randint(1, TOKEN_STEP_MAX)
        caps: list[object] = []
        if name_limits:
            caps = [""]  # after the queues (never empty): the name, cap pairs
            for name, cap in name_limits.items():
                caps += [name, int(cap)]
        reply = self._run("claim", worker_id, lease_until, limit, step, *queues, *caps, now=now)
        next_due = text(reply[0])
        due = int(next_due) if next_due else None
        for queue in queues:  # the earliest of the call's queues: at worst a wake-up too early
            self._next_due[queue] = due
        return [claimed(text(reply[i]), reply[i + 1]) for i in range(1, len(reply), 2)]

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
    def server_warnings(self) -> builtins.list[str]:
        """What is wrong with the Redis server's configuration for holding tasks."""
        try:
            info = self.client.info("memory")
        except self._unavailable:
            raise
        except Exception:  # INFO refused (a restricted ACL user): nothing to say
            return []
        if isinstance(info, dict) and "maxmemory_policy" not in info:
            info = next(iter(info.values()), {})  # a Cluster client answers per node
        policy = text(info.get("maxmemory_policy", "noeviction"))
        if policy == "noeviction":
            return []
        return [
            f"Redis at {self.where} has maxmemory-policy {policy}: when memory runs short it "
            "deletes keys, and these keys are tasks. Set maxmemory-policy noeviction."
        ]

    @guarded
    def wake(self, queues: Sequence[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for queue in queues:
            pipe.lpush(self.p + "wake:" + queue, "1")
            pipe.ltrim(self.p + "wake:" + queue, 0, 0)
        pipe.execute()

    def start(self, claim: Claim, lease_seconds: float) -> Claim | None:
        return self.start_many([claim], lease_seconds)[0]

    @guarded
    def start_many(self, claims: Sequence[Claim], lease_seconds: float) -> list[Claim | None]:
        if not claims:
            return []
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        args = [value for claim in claims for value in (claim.task_id, claim.token)]
        replies = self._run("start", lease_until, nonce(), *args, now=now)
        return [
            claim.started(now) if started == 1 else None
            for claim, started in zip(claims, replies, strict=True)
        ]

    @guarded
    def heartbeat(
        self, worker_id: str, tokens: Mapping[str, int], lease_seconds: float
    ) -> dict[str, tuple[int, bool]]:
        if not tokens:
            return {}
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        args = [value for task_id, token in tokens.items() for value in (task_id, token)]
        replies = self._run("heartbeat", worker_id, lease_until, *args, now=now)
        return {
            text(task_id): (int(token), text(cancel) == "1") for task_id, token, cancel in replies
        }

    def complete(self, claim: Claim, result: object) -> Transition | None:
        return self.complete_many([(claim, result)])[0]

    @guarded
    def complete_many(self, outcomes: Sequence[tuple[Claim, object]]) -> list[Transition | None]:
        if not outcomes:
            return []
        now = self.clock.now()
        results = [encoded(result) for _, result in outcomes]  # a worker's are encoded already
        args = [
            value
            for (claim, _), result in zip(outcomes, results, strict=True)
            for value in (claim.task_id, claim.token, result.text)
        ]
        replies = self._run("complete", nonce(), *args, now=now)
        return [
            claim.completed(result.value, now) if done == 1 else None
            for (claim, _), result, done in zip(outcomes, results, replies, strict=True)
        ]

    @guarded
    def fail(
        self, claim: Claim, error: str, *, retryable: bool, is_error: bool = False
    ) -> Transition | None:
        now = self.clock.now()
        # The outcome without a cancel request; the script turns it into CANCELLED if one was
        # made meanwhile (a requested cancel wins, as in failure_outcome).
        status, run_at = failure_outcome(
            claim,
            retryable=retryable,
            cancel_requested=False,
            now=now,
            backoff_cap_millis=self.backoff_cap_millis,
        )
        reply = self._run(
            "fail",
            claim.task_id,
            claim.token,
            error,
            status.value,
            micros(run_at) if run_at is not None else "",
            "1" if is_error else "0",
            nonce(),
            now=now,
        )
        if reply is None:
            return None
        final = TaskStatus(text(reply[0]))
        pending = final is TaskStatus.PENDING
        task = dataclasses.replace(
            claim.task,
            status=final,
            last_error=error,
            run_at=run_at if pending and run_at is not None else claim.task.run_at,
            finished_at=None if pending else now,
            cancel_requested=not is_error and text(reply[1]) == "1",
        )
        return Transition(task=task, previous=TaskStatus.RUNNING)

    @guarded
    def expire_claim(self, claim: Claim) -> Transition | None:
        now = self.clock.now()
        error = timeout_message(claim.task.max_duration_millis, claim.task.last_error)
        previous = self._run("expire_claim", claim.task_id, claim.token, error, now=now)
        if previous is None:
            return None
        task = dataclasses.replace(
            claim.task, status=TaskStatus.TIMEOUT, last_error=error, finished_at=now
        )
        return Transition(task=task, previous=TaskStatus(text(previous)))

    @guarded
    def release(self, claims: Sequence[Claim]) -> int:
        if not claims:
            return 0
        args = [value for claim in claims for value in (claim.task_id, claim.token)]
        return int(self._run("release", *args))

    # -- operating ------------------------------------------------------------------------
    @guarded
    def cancel(self, task_id: str) -> CancelResult:
        reply = self._run("cancel", task_id)
        if reply is None:
            return CancelResult(changed=False, task=None)
        outcome = text(reply[0])
        info = to_info(task_id, fields(reply[1]))
        return CancelResult(
            changed=outcome != "unchanged", task=info, requested_only=outcome == "requested"
        )

    @guarded
    def retry(self, task_id: str) -> Transition | None:
        before = self.get(task_id)
        if before is None or before.status not in RETRYABLE_BY_HAND:
            return None
        now = self.clock.now()
        deadline = (
            micros(now + dt.timedelta(milliseconds=before.max_duration_millis))
            if before.max_duration_millis
            else ""
        )
        reply = self._run("retry", task_id, before.status.value, deadline, now=now)
        if reply is None:
            return None
        if text(reply[0]) == "held":
            raise AttemptStillRunningError(
                task_id, text(reply[1]) or None, from_micros(text(reply[2]))
            )
        return Transition(task=to_info(task_id, fields(reply[1])), previous=before.status)


__all__ = ["RedisStorage"]
