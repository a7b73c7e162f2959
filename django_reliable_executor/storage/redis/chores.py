"""The master's chores on the Redis storage: promote due tasks, recover leases, time out, purge."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from ...core.records import TaskInfo, Transition
from ...core.retries import failure_outcome, timeout_message
from ...core.states import TERMINAL_STATUSES, TaskStatus
from .access import LIVE, READ_CHUNK, RedisAccess, guarded
from .codec import micros, text, to_claim, to_info
from .sharding import directory_of

# Queue names the purge chore checks per round for holding nothing (then forgets them): purge
# forgets a queue as it deletes its last task, so this finds only names left behind otherwise
# (by a version that never forgot one), a bounded step at a time.
QUEUE_SWEEP = 200


class Chores(RedisAccess):
    """Each chore reads a batch from an index, decides in Python, then compare-and-sets in Lua.

    Every chore visits the shards one after the other, up to its limit on each: a round over
    N shards does N bounded steps, so each shard keeps the recovery bound of one shard. A
    worker runs them only on the shards whose chore lock it holds (``chores_on``)."""

    # -- master-only chores ---------------------------------------------------------------
    @guarded
    def promote_due(self, limit: int) -> int:
        return sum(int(self._run("promote", limit, shard=s)) for s in self._chore_range())

    @guarded
    def recover_expired(self, limit: int) -> list[Transition]:
        return [t for s in self._chore_range() for t in self._recover(limit, s)]

    def _recover(self, limit: int, shard: int) -> list[Transition]:
        now = self.clock.now()
        ids = self._due_ids("leases", now, limit, inclusive=False, shard=shard)
        tasks = self._read_many(ids, shard=shard)
        args: list[Any] = []
        outcomes: dict[str, TaskInfo] = {}
        for task_id, values in tasks.items():
            status, outcome, run_at, error = values["s"], "", "", ""
            if status == "RUNNING":
                claim = to_claim(task_id, values)
                error = f"worker lost: {values.get('w')} stopped renewing its lease"
                next_status, next_run = failure_outcome(
                    claim,
                    now,
                    self.backoff_cap_millis,
                    retryable=True,
                    cancel_requested=claim.task.cancel_requested,
                )
                outcome = next_status.value
                run_at = micros(next_run) if next_run is not None else ""
                outcomes[task_id] = dataclasses.replace(
                    claim.task,
                    status=next_status,
                    last_error=error,
                    run_at=next_run or claim.task.run_at,
                    finished_at=None if next_run else now,
                    handler_running=False,
                )
            args += [task_id, values["k"], status, values.get("x", "0"), outcome, run_at, error]
        if not args:
            return []
        changed = self._run("recover", *args, now=now, shard=shard)
        return [
            Transition(task=outcomes[text(task_id)], previous=TaskStatus.RUNNING)
            for task_id in changed
        ]

    @guarded
    def expire_overdue(self, limit: int) -> list[Transition]:
        return [t for s in self._chore_range() for t in self._expire(limit, s)]

    def _expire(self, limit: int, shard: int) -> list[Transition]:
        now = self.clock.now()
        ids = self._due_ids("deadlines", now, limit, inclusive=True, shard=shard)
        tasks = self._read_many(ids, shard=shard)
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
                    info,
                    status=TaskStatus.TIMEOUT,
                    last_error=error,
                    finished_at=now,
                    # A RUNNING one's handler runs on: expire.lua keeps its lease.
                    handler_running=info.status is TaskStatus.RUNNING,
                ),
                previous=info.status,
            )
        if not args:
            return []
        changed = self._run("expire", *args, now=now, shard=shard)
        return [outcomes[text(task_id)] for task_id in changed]

    @guarded
    def _purge_finished(
        self, finished_before: dt.datetime, limit: int, statuses: frozenset[TaskStatus]
    ) -> int:
        return sum(self._purge(finished_before, limit, statuses, s) for s in self._chore_range())

    def _purge(
        self,
        finished_before: dt.datetime,
        limit: int,
        statuses: frozenset[TaskStatus],
        shard: int,
    ) -> int:
        cutoff = micros(finished_before)
        if statuses == TERMINAL_STATUSES:
            ids = self._due_ids("finished", finished_before, limit, inclusive=False, shard=shard)
        else:
            ids = self._finished_of(statuses, cutoff, limit, shard)
        ids = self._unleased(ids, shard)
        purged = int(self._run("purge", cutoff, *ids, shard=shard)) if ids else 0
        if self.sharded and purged:
            self._release_ids(ids, shard)
        self._forget_empty_queues(shard)
        return purged

    def _release_ids(self, ids: list[str], shard: int) -> None:
        """Sharded: the directory entries of the purged tasks of ``shard`` stored off their
        directory shard (id_release.lua keeps an entry naming another shard). A crash before
        leaves entries naming a task that is gone: read as not found, taken over by a submit
        after the grace (see id_reserve.lua)."""
        foreign = [i for i in ids if directory_of(i, self.layout.shards) != shard]
        if not foreign:
            return
        pipe = self.client.pipeline(transaction=False)
        for task_id in foreign:
            pipe.exists(self._tkey(task_id, shard))
        by_directory: dict[int, list[str]] = {}
        for task_id, exists in zip(foreign, pipe.execute(), strict=True):
            if not exists:
                by_directory.setdefault(directory_of(task_id, self.layout.shards), []).append(
                    task_id
                )
        for directory, gone in sorted(by_directory.items()):
            self._run("id_release", shard, *gone, shard=directory)

    def _forget_empty_queues(self, shard: int) -> int:
        """One step of the sweep through the shard's queue set: forget those of the next names
        that hold nothing (the script checks each again, so a submit meanwhile keeps its
        queue)."""
        key = self.prefixes[shard] + "queues"
        cursor, names = self.client.sscan(key, self._queue_cursors[shard], count=QUEUE_SWEEP)
        self._queue_cursors[shard] = int(cursor)
        return int(self._run("forget_queues", *names, shard=shard)) if names else 0

    def _unleased(self, ids: list[str], shard: int) -> list[str]:
        """The ids less the terminal tasks still in the leases: a task that timed out while its
        handler still runs is kept until its holder's lease ends (recover lets it go), so
        `held` stays exact. A terminal task cannot enter the leases again (only a retry, which
        makes it waiting, leads there), so what this reads stays true until the purge script
        runs; live tasks go on to the script, which drops their stray finished entries."""
        if not ids:
            return ids
        prefix = self.prefixes[shard]
        pipe = self.client.pipeline(transaction=False)
        for task_id in ids:
            pipe.zscore(prefix + "leases", task_id)
            pipe.hget(prefix + "t:" + task_id, "s")
        replies = pipe.execute()
        return [
            task_id
            for task_id, held, status in zip(ids, replies[::2], replies[1::2], strict=True)
            if held is None or status is None or text(status) in LIVE
        ]

    def _finished_of(
        self, statuses: frozenset[TaskStatus], cutoff: str, limit: int, shard: int
    ) -> list[str]:
        """Up to ``limit`` ids of these statuses that finished before the cutoff, oldest first:
        the finished index read in windows, skipping tasks of other statuses."""
        chosen = {status.value for status in statuses}
        picked: list[str] = []
        start = 0
        prefix = self.prefixes[shard]
        while len(picked) < limit:
            window = self.client.zrangebyscore(
                prefix + "finished", "-inf", "(" + cutoff, start=start, num=READ_CHUNK
            )
            if not window:
                break
            start += len(window)
            ids = [text(task_id) for task_id in window]
            pipe = self.client.pipeline(transaction=False)
            for task_id in ids:
                pipe.hget(prefix + "t:" + task_id, "s")
            states = pipe.execute()
            picked += [i for i, s in zip(ids, states, strict=True) if s and text(s) in chosen]
        return picked[:limit]
