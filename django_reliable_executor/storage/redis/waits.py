"""Durable waits on the Redis storage: suspend.lua hands a waiting task back (its wait in the
task hash's ``wt``, its record in ``P steps:<id>``), event.lua stores an event in
``P events:<id>`` (on the task's shard) and wakes the task waiting for it, and the tasks a
``wait_for`` awaits hold it in their ``P deps:<id>`` as a dependent, so their ending wakes it."""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import Any

from ...core.dependencies import WAITING_RUN_AT
from ...core.records import Claim, Transition
from ...core.serialization import Encoded
from ...core.states import TaskStatus
from ...core.waits import TASKS, WAIT_KINDS, Wait
from ...exceptions import StorageUnavailableError
from .access import LIVE, RedisAccess, guarded
from .codec import from_micros, micros, packed_wait, text

logger = logging.getLogger("django_reliable_executor")


class Waits(RedisAccess):
    """suspend (suspend.lua), send_event (event.lua) and task_events."""

    @guarded
    def suspend(self, claim: Claim, wait: Wait | None) -> Transition | None:
        now = self.clock.now()
        shard = claim.shard
        local: list[str] = []
        remote: list[str] = []
        if wait is not None and wait.task_ids:
            local, remote = self._link_awaited(claim, list(wait.task_ids))
        args: list[Any] = [claim.task_id, claim.task.worker_id or "", claim.token]
        if wait is None:
            args += ["", "", "", "", micros(now), ""]
        else:
            args += [
                wait.kind,
                wait.name,
                packed_wait(wait),
                json.dumps(wait.record(), separators=(",", ":")),
                micros(wait.until or WAITING_RUN_AT),
                wait.event or "",
            ]
        reply = self._run("suspend", *args, len(local), *local, *remote, now=now, shard=shard)
        if reply is None:
            return None
        run_at, awaited = from_micros(text(reply[0])), tuple(json.loads(text(reply[1])))
        if remote:
            self._settle_remote_soon(claim, remote)
        task = claim.task
        return Transition(
            task=dataclasses.replace(
                task,
                status=TaskStatus.PENDING,
                run_at=run_at,
                attempts=task.attempts - 1,
                resumptions=int(reply[2]),
                waiting=None if wait is None else wait.describe(),
                waiting_for=awaited,
                handler_running=False,
            ),
            previous=TaskStatus.RUNNING,
        )

    def _link_awaited(self, claim: Claim, task_ids: list[str]) -> tuple[list[str], list[str]]:
        """The awaited tasks stored on the waiter's shard (suspend.lua reads them), and,
        sharded, those of other shards still live, each registered there first as a dependent
        ("<shard> <id>", dep_link.lua), so their ending sends the waiter a message."""
        if not self.sharded:
            return task_ids, []
        local, remote = [], []
        by_shard: dict[int, list[str]] = {}
        for task_id in task_ids:
            home = self._task_shard(task_id)
            if home == claim.shard:
                local.append(task_id)
            else:
                by_shard.setdefault(home, []).append(task_id)
        for home, listed in sorted(by_shard.items()):
            replies = self._run("dep_link", claim.shard, claim.task_id, *listed, shard=home)
            remote += [d for d, s in zip(listed, replies, strict=True) if text(s) in LIVE]
        return local, remote

    def _settle_remote_soon(self, claim: Claim, remote: list[str]) -> None:
        """``_settle_remote``, tried again for a few seconds while a shard is out of reach:
        the suspend is made, and an ending missed between link and suspend would leave the
        task waiting until the master's sweep of waits (``settle_waits``)."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        for pause in (0.05, 0.2, 0.5, 1.0, 2.0, None):
            try:
                self._settle_remote(claim.task_id, claim.shard, remote)
                return
            except (RedisConnectionError, RedisTimeoutError, StorageUnavailableError):
                if pause is None:
                    logger.error(
                        "task %s: could not check the tasks of other shards it waits for: one that "
                        "ended just now leaves it waiting until the master's next sweep of waits",
                        claim.task_id,
                        exc_info=True,
                    )
                    return
                time.sleep(pause)

    def _settle_remote(self, waiter: str, shard: int, remote: list[str]) -> None:
        """Awaited tasks of other shards that ended between their link and the suspend: their
        message reached a waiter still RUNNING, which ignored it; settled here instead (each
        ending settles a waiter once, however often this runs)."""
        ended = []
        for task_id in remote:
            info = self.get(task_id)
            if info is None or (info.is_terminal and not info.handler_running):
                ended.append(task_id)
        if ended:
            self._run("wait_settle", waiter, *ended, shard=shard)

    @guarded
    def settle_waits(self, limit: int) -> int:
        """Sharded: a bounded step through each chore shard's ``P waits``, resumed where the
        last step stopped; each wait for tasks is settled as after its suspend
        (``_settle_remote``), for the suspend whose own check gave up. Every awaited id is
        looked up (a purged one cannot be told apart from a local one), at most ``limit`` a
        shard per step. Returns how many awaited ids it looked up."""
        if not self.sharded:
            return 0
        cursors: dict[int, int] = vars(self).setdefault("_wait_cursors", {})
        looked = 0
        for shard in self._chore_range():
            key = self.prefixes[shard] + "waits"
            after, entries = self.client.hscan(key, cursors.get(shard, 0), count=limit)
            budget = limit
            for waiter, kind in entries.items():
                if text(kind) != TASKS:
                    continue
                awaited = self.client.hget(self._tkey(text(waiter), shard), "wf")
                ids = json.loads(text(awaited)) if awaited else []
                if ids:
                    self._settle_remote(text(waiter), shard, ids)
                budget -= len(ids)
                if budget <= 0:
                    break
            looked += limit - budget
            cursors[shard] = after if budget > 0 else cursors.get(shard, 0)
        return looked

    @guarded
    def send_event(self, task_id: str, name: str, payload: Encoded) -> bool:
        now = self.clock.now()
        shard = self._task_shard(task_id)
        sent = self._run("event", task_id, name, f"{micros(now)} {payload.text}", shard=shard)
        return bool(int(sent))

    @guarded
    def task_events(self, task_id: str) -> dict[str, Any]:
        shard = self._task_shard(task_id)
        values = self.client.hgetall(self.prefixes[shard] + "events:" + task_id)
        entries = []
        for name, value in values.items():
            sent_at, payload = text(value).split(" ", 1)
            entries.append((int(sent_at), text(name), payload))
        return {name: json.loads(payload) for _, name, payload in sorted(entries)}

    @guarded
    def count_waiting(self) -> dict[str, int]:
        counts = dict.fromkeys(WAIT_KINDS, 0)
        for prefix in self.prefixes:  # every shard's P waits:count (_common.lua)
            for kind, n in self.client.hgetall(prefix + "waits:count").items():
                if text(kind) in counts:
                    counts[text(kind)] += int(n)
        return counts
