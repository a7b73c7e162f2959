"""RedisStorage: every task in a hash, every state change one atomic Lua script.

Key layout. ``P`` is ``{KEY_PREFIX}:``; the braces make it a Cluster hash tag, so every key
lives in one hash slot and a script may touch any of them. Times are microseconds since the
epoch, written as decimal strings.

``P t:<id>``               HASH, one per task. n name, q queue, p priority, s status, j parameter
                           (JSON), a attempts, b attempts against the current retry budget,
                           k fencing token, rl/ri/rb retry limit/interval/backoff, md max
                           duration (ms), c created, r run at, st started, f finished,
                           d deadline, e last error, o result (JSON), w worker, x cancel
                           requested ("1"). Fields without a value are absent.
``P ready:<queue>:<prio>`` LIST of task ids ready to run, oldest first (FIFO within a priority).
``P prio:<queue>``         ZSET of the priorities that have a non-empty ready list (claims take
                           the highest first).
``P sched:<queue>``        ZSET of waiting tasks not due yet (delayed, or retrying after a
                           backoff), scored by run at. Claims and submits promote due ones.
``P leases``               ZSET of claimed and running tasks, scored by lease expiry.
``P deadlines``            ZSET of unfinished tasks with a max duration, scored by deadline.
``P finished``             ZSET of terminal tasks, scored by finish time (listing, purge).
``P counts``               HASH "<STATUS>:<queue>" -> number of tasks, kept exact by every script.
``P queues``               SET of every queue name submitted to.
``P wake:<queue>``         LIST holding at most one token: idle workers block on it (BLPOP).
``P lock:<name>``          STRING "<expiry>:<owner>" with a PX expiry: a named lease.
``P workers``, ``P workers:seen``  HASH worker id -> JSON, ZSET worker id -> last heartbeat.

A waiting task is in exactly one of a ready list, its queue's schedule or (claimed) the leases;
a running task is in the leases; a terminal one in the finished index. Each script in
storage/lua/ is a compare-and-set on the status (and the claim's token) it expects, so a lost
race changes nothing. Nothing read back is ever unpickled: parameters and results are JSON.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...clock import Clock
from ...exceptions import StorageUnavailableError
from ...records import CancelResult, Claim, NewTask, TaskInfo, Transition, WorkerInfo, new_info
from ...retries import after_failure, timeout_message
from ...serialization import dumps
from ...states import RETRYABLE_BY_HAND, TERMINAL_STATUSES, TaskStatus
from ..base import TaskStorage
from .codec import fields, from_micros, micros, submit_args, text, to_claim, to_info
from .scripts import Scripts

F = TypeVar("F", bound=Callable[..., Any])
SUBMIT_CHUNK = 500  # tasks per submit script call: long enough to amortise, short enough not
# to hold Redis up (a script blocks every other client while it runs)
READ_CHUNK = 1000
WAITING = ("CREATED", "PENDING")
LIVE = (*WAITING, "RUNNING")


def _unavailable_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import ConnectionError, TimeoutError

    return (ConnectionError, TimeoutError)  # BusyLoadingError (AOF replay) is a ConnectionError


def guarded(method: F) -> F:
    """Turn "Redis cannot be reached" into StorageUnavailableError naming where it was."""

    @functools.wraps(method)
    def wrapper(self: RedisStorage, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except self._unavailable as exc:
            raise StorageUnavailableError(
                f"Redis at {self.where} cannot be reached: {exc}"
            ) from exc

    return wrapper  # type: ignore[return-value]


class RedisStorage(TaskStorage):
    """Tasks in Redis under one key prefix (see the module docstring for the key layout)."""

    #: Idle workers may block in wait_for_work instead of sleeping.
    blocking_wait = True

    def __init__(
        self,
        client: Any,
        key_prefix: str = "reliable_executor",
        *,
        clock: Clock | None = None,
        backoff_cap_millis: int = 300000,
        where: str = "redis",
        owns_client: bool = True,
    ) -> None:
        super().__init__(clock)
        self.client = client
        self.key_prefix = key_prefix
        self.p = "{" + key_prefix + "}:"
        self.backoff_cap_millis = backoff_cap_millis
        self.where = where
        self._owns_client = owns_client
        self._keys = [self.p + "counts"]  # routes every script to the prefix's hash slot
        self._scripts = Scripts(client)
        self._unavailable = _unavailable_errors()
        self._next_due: dict[tuple[str, ...], int | None] = {}

    def _run(self, name: str, *args: Any, now: dt.datetime | None = None) -> Any:
        now = now or self.clock.now()
        script = getattr(self._scripts, name)
        return script(keys=self._keys, args=[self.p, micros(now), *args])

    def _tkey(self, task_id: str) -> str:
        return self.p + "t:" + task_id

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
        self, worker_id: str, queues: Sequence[str], limit: int, lease_seconds: float
    ) -> list[Claim]:
        if limit <= 0 or not queues:
            return []
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        reply = self._run("claim", worker_id, lease_until, limit, *queues, now=now)
        next_due = text(reply[0])
        self._next_due[tuple(queues)] = int(next_due) if next_due else None
        return [to_claim(text(reply[i]), fields(reply[i + 1])) for i in range(1, len(reply), 2)]

    @guarded
    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a submit (or a hand-back) wakes this queue, the next scheduled task of
        these queues is due, or ``timeout`` seconds pass. True when woken by a token."""
        next_due = self._next_due.get(tuple(queues))
        if next_due is not None:
            until_due = (next_due - int(micros(self.clock.now()))) / 1e6
            if until_due <= 0:
                return False
            timeout = min(timeout, until_due)
        timeout = max(timeout, 0.001)  # 0 would mean "forever" to BLPOP
        keys = [self.p + "wake:" + queue for queue in queues]
        return self.client.blpop(keys, timeout=timeout) is not None

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
        replies = self._run("start", lease_until, *args, now=now)
        return [
            dataclasses.replace(
                claim,
                task=dataclasses.replace(
                    claim.task,
                    status=TaskStatus.RUNNING,
                    attempts=claim.task.attempts + 1,
                    started_at=now,
                ),
                budget_attempts=claim.budget_attempts + 1,
            )
            if started == 1
            else None
            for claim, started in zip(claims, replies, strict=True)
        ]

    @guarded
    def heartbeat(
        self, worker_id: str, task_ids: Sequence[str], lease_seconds: float
    ) -> dict[str, tuple[int, bool]]:
        if not task_ids:
            return {}
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        replies = self._run("heartbeat", worker_id, lease_until, *task_ids, now=now)
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
        args = [
            value
            for claim, result in outcomes
            for value in (claim.task_id, claim.token, dumps(result))
        ]
        replies = self._run("complete", *args, now=now)
        return [
            Transition(
                task=dataclasses.replace(
                    claim.task, status=TaskStatus.COMPLETED, result=result, finished_at=now
                ),
                previous=TaskStatus.RUNNING,
            )
            if done == 1
            else None
            for (claim, result), done in zip(outcomes, replies, strict=True)
        ]

    @guarded
    def fail(
        self, claim: Claim, error: str, *, retryable: bool, is_error: bool = False
    ) -> Transition | None:
        now = self.clock.now()
        # The outcome without a cancel request; the script turns it into CANCELLED if one was
        # made meanwhile (a requested cancel wins, as in after_failure).
        status, run_at = after_failure(
            budget_attempts=claim.budget_attempts,
            retry_limit=claim.task.retry_limit,
            retryable=retryable,
            cancel_requested=False,
            deadline_at=claim.deadline_at,
            now=now,
            retry_interval=claim.task.retry_interval,
            retry_backoff=claim.task.retry_backoff,
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
        return Transition(task=to_info(task_id, fields(reply)), previous=before.status)

    # -- leader-only chores ---------------------------------------------------------------
    @guarded
    def promote_due(self, limit: int) -> int:
        return int(self._run("promote", limit))

    def _read_many(self, task_ids: Sequence[str]) -> dict[str, dict[str, str]]:
        """Full hashes of these tasks (missing ones left out), a pipeline per chunk."""
        found: dict[str, dict[str, str]] = {}
        for start in range(0, len(task_ids), READ_CHUNK):
            chunk = task_ids[start : start + READ_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for task_id in chunk:
                pipe.hgetall(self._tkey(task_id))
            for task_id, values in zip(chunk, pipe.execute(), strict=True):
                if values:
                    found[task_id] = {text(k): text(v) for k, v in values.items()}
        return found

    def _due_ids(self, index: str, now: dt.datetime, limit: int, *, inclusive: bool) -> list[str]:
        bound = micros(now) if inclusive else "(" + micros(now)
        ids = self.client.zrangebyscore(self.p + index, "-inf", bound, start=0, num=limit)
        return [text(task_id) for task_id in ids]

    @guarded
    def recover_expired(self, limit: int) -> list[Transition]:
        now = self.clock.now()
        tasks = self._read_many(self._due_ids("leases", now, limit, inclusive=False))
        args: list[Any] = []
        outcomes: dict[str, TaskInfo] = {}
        for task_id, values in tasks.items():
            status, outcome, run_at, error = values["s"], "", "", ""
            if status == "RUNNING":
                claim = to_claim(task_id, values)
                error = f"worker lost: {values.get('w')} stopped renewing its lease"
                next_status, next_run = after_failure(
                    budget_attempts=claim.budget_attempts,
                    retry_limit=claim.task.retry_limit,
                    retryable=True,
                    cancel_requested=claim.task.cancel_requested,
                    deadline_at=claim.deadline_at,
                    now=now,
                    retry_interval=claim.task.retry_interval,
                    retry_backoff=claim.task.retry_backoff,
                    backoff_cap_millis=self.backoff_cap_millis,
                )
                outcome = next_status.value
                run_at = micros(next_run) if next_run is not None else ""
                outcomes[task_id] = dataclasses.replace(
                    claim.task,
                    status=next_status,
                    last_error=error,
                    run_at=next_run or claim.task.run_at,
                    finished_at=None if next_run else now,
                )
            args += [task_id, values["k"], status, values.get("x", "0"), outcome, run_at, error]
        if not args:
            return []
        changed = self._run("recover", *args, now=now)
        return [
            Transition(task=outcomes[text(task_id)], previous=TaskStatus.RUNNING)
            for task_id in changed
        ]

    @guarded
    def expire_overdue(self, limit: int) -> list[Transition]:
        now = self.clock.now()
        tasks = self._read_many(self._due_ids("deadlines", now, limit, inclusive=True))
        args: list[Any] = []
        outcomes: dict[str, Transition] = {}
        for task_id, values in tasks.items():
            if values["s"] not in LIVE:
                continue
            info = to_info(task_id, values)
            error = timeout_message(info.max_duration_millis, info.last_error)
            args += [task_id, values["k"], values["s"], error]
            outcomes[task_id] = Transition(
                task=dataclasses.replace(
                    info, status=TaskStatus.TIMEOUT, last_error=error, finished_at=now
                ),
                previous=info.status,
            )
        if not args:
            return []
        changed = self._run("expire", *args, now=now)
        return [outcomes[text(task_id)] for task_id in changed]

    @guarded
    def purge_finished(self, finished_before: dt.datetime, limit: int) -> int:
        return int(self._run("purge", micros(finished_before), limit))

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

    # -- leadership and workers -----------------------------------------------------------
    @guarded
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        now = self.clock.now()
        expires = micros(now + dt.timedelta(seconds=ttl_seconds))
        ttl_millis = max(1, int(ttl_seconds * 1000))
        return self._run("lock_acquire", name, owner, expires, ttl_millis, now=now) == 1

    @guarded
    def release_lock(self, name: str, owner: str) -> None:
        self._run("lock_release", name, owner)

    @guarded
    def lock_owner(self, name: str) -> str | None:
        value = self.client.get(self.p + "lock:" + name)
        if value is None:
            return None
        expires, _, owner = text(value).partition(":")
        return owner if from_micros(expires) >= self.clock.now() else None

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
    def forget_workers(self, seen_before: dt.datetime) -> int:
        silent = self._due_ids("workers:seen", seen_before, 1000, inclusive=False)
        if not silent:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.hdel(self.p + "workers", *silent)
        pipe.zrem(self.p + "workers:seen", *silent)
        return int(pipe.execute()[1])

    def close(self) -> None:
        if self._owns_client:
            self.client.close()


__all__ = ["RedisStorage"]
