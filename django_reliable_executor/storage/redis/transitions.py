"""The task transitions of the Redis storage: start, heartbeat, complete, fail, expire, release,
cancel and retry, each one Lua script (storage/redis/lua/<name>.lua) fenced by the claim's token."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import operator
from collections.abc import Mapping, Sequence
from itertools import chain, repeat

from ...core.dependencies import WAITING_RUN_AT
from ...core.records import CancelResult, Claim, Transition
from ...core.retries import failure_outcome, timeout_message
from ...core.serialization import Encoded, encoded
from ...core.states import LIVE_STATUSES, RETRYABLE_BY_HAND, TaskStatus
from ...exceptions import (
    AttemptStillRunningError,
    DependencyNotCompletedError,
    UnknownStepError,
)
from .access import RedisAccess, guarded
from .codec import fields, from_micros, micros, nonce, stored_steps, text, to_info
from .sharding import CONTROL_SHARD, directory_of

ID_AND_TOKEN = operator.attrgetter("task.task_id", "token")
TASK_ID = operator.attrgetter("task.task_id")
TOKEN = operator.attrgetter("token")
TEXT = operator.attrgetter("text")
FIRST = operator.itemgetter(0)
# Sharded, a claim's writes go to the shard it was claimed on (Claim.shard).
SHARD = operator.attrgetter("shard")


def _outcome_shard(outcome: tuple[Claim, object]) -> int:
    return outcome[0].shard


LIVE_VALUES = frozenset(status.value for status in LIVE_STATUSES)
SECOND = operator.itemgetter(1)
VALUE = operator.attrgetter("value")


class Transitions(RedisAccess):
    """Every change of one task's state after it was stored, each a compare-and-set script."""

    def start(self, claim: Claim, lease_seconds: float) -> Claim | None:
        return self.start_many([claim], lease_seconds)[0]

    @guarded
    def start_many(self, claims: Sequence[Claim], lease_seconds: float) -> list[Claim | None]:
        if not claims:
            return []
        return self._each_shard(
            claims, SHARD, lambda part, shard: self._start_on(part, lease_seconds, shard)
        )

    def _start_on(
        self, claims: Sequence[Claim], lease_seconds: float, shard: int
    ) -> list[Claim | None]:
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        args = chain.from_iterable(map(ID_AND_TOKEN, claims))  # read in C: no bytecode a claim
        replies = self._run("start", lease_until, nonce(), *args, now=now, shard=shard)
        if len(replies) == len(claims) and replies.count(1) == len(replies):  # all started
            return list(map(Claim.started, claims, repeat(now)))  # no bytecode of a loop
        return [
            claim.started(now) if started == 1 else None
            for claim, started in zip(claims, replies, strict=True)
        ]

    def complete(self, claim: Claim, result: object) -> Transition | None:
        return self.complete_many([(claim, result)])[0]

    @guarded
    def complete_many(self, outcomes: Sequence[tuple[Claim, object]]) -> list[Transition | None]:
        if not outcomes:
            return []
        return self._each_shard(outcomes, _outcome_shard, self._complete_on)

    def _complete_on(
        self, outcomes: Sequence[tuple[Claim, object]], shard: int
    ) -> list[Transition | None]:
        now = self.clock.now()
        # A worker's are encoded already (encoded() for the others, without a call per task).
        results = list(map(SECOND, outcomes))
        if set(map(type, results)) != {Encoded}:
            results = [r if type(r) is Encoded else encoded(r) for r in results]
        claims = list(map(FIRST, outcomes))
        # task id, token and result text of each, read in C: no bytecode a task.
        args = chain.from_iterable(
            zip(map(TASK_ID, claims), map(TOKEN, claims), map(TEXT, results), strict=True)
        )
        replies = self._run("complete", nonce(), *args, now=now, shard=shard)
        if len(replies) == len(claims) and replies.count(1) == len(replies):  # all recorded
            return list(map(Claim.completed, claims, map(VALUE, results), repeat(now)))
        if 2 in replies:  # sharded: an ending told another shard (a dependent, a batch)
            self._deliver_now(shard)
        return [
            claim.completed(result.value, now) if done else None
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
            claim, now, self.backoff_cap_millis, retryable=retryable, cancel_requested=False
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
            shard=claim.shard,
        )
        if reply is None:
            return None
        if len(reply) > 2:  # sharded: the ending told another shard (a dependent, a batch)
            self._deliver_now(claim.shard)
        final = TaskStatus(text(reply[0]))
        pending = final is TaskStatus.PENDING
        task = dataclasses.replace(
            claim.task,
            status=final,
            last_error=error,
            run_at=run_at if pending and run_at is not None else claim.task.run_at,
            finished_at=None if pending else now,
            cancel_requested=not is_error and text(reply[1]) == "1",
            handler_running=False,
        )
        return Transition(task=task, previous=TaskStatus.RUNNING)

    @guarded
    def expire_claim(self, claim: Claim) -> Transition | None:
        now = self.clock.now()
        error = timeout_message(claim.task.max_duration_millis, claim.task.last_error)
        previous = self._run(
            "expire_claim",
            claim.task_id,
            claim.token,
            error,
            now=now,
            shard=claim.shard,
        )
        if previous is None:
            return None
        task = dataclasses.replace(
            claim.task,
            status=TaskStatus.TIMEOUT,
            last_error=error,
            finished_at=now,
            handler_running=False,
        )
        return Transition(task=task, previous=TaskStatus(text(previous)))

    @guarded
    def release(self, claims: Sequence[Claim]) -> int:
        if not claims:
            return 0
        return sum(self._each_shard(claims, SHARD, self._release_on))

    def _release_on(self, claims: Sequence[Claim], shard: int) -> list[int]:
        """How many of these claims were handed back (the count first, zeros for the rest)."""
        args = [value for claim in claims for value in (claim.task_id, claim.token)]
        released = int(self._run("release", *args, shard=shard))
        return [released] + [0] * (len(claims) - 1)

    @guarded
    def handler_returned(self, claims: Sequence[Claim]) -> int:
        if not claims:
            return 0
        return sum(self._each_shard(claims, SHARD, self._handler_returned_on))

    def _handler_returned_on(self, claims: Sequence[Claim], shard: int) -> list[int]:
        """How many of these claims' tasks ended (the count first, zeros for the rest)."""
        args = [value for claim in claims for value in (claim.task_id, claim.token)]
        ended = int(self._run("handler_returned", *args, shard=shard))
        if ended < 0:  # sharded: an ending told another shard (a dependent, a batch)
            self._deliver_now(shard)
            ended = -ended - 1
        return [ended] + [0] * (len(claims) - 1)

    @guarded
    def cancel(self, task_id: str) -> CancelResult:
        reply = self._run("cancel", task_id, shard=self._task_shard(task_id))
        if reply is None:
            return CancelResult(changed=False, task=None)
        outcome = text(reply[0])
        info = to_info(task_id, fields(reply[1]))
        return CancelResult(
            changed=outcome != "unchanged", task=info, requested_only=outcome == "requested"
        )

    @guarded
    def retry(self, task_id: str, from_step: str | None = None) -> Transition | None:
        if self.sharded:  # read where it is stored (a task is not always on its queue's shard)
            shard, values = self._locate(task_id)
            before = (
                to_info(task_id, {text(k): text(v) for k, v in values.items()}) if values else None
            )
        else:
            shard, before = CONTROL_SHARD, self.get(task_id)
        if before is None or before.status not in RETRYABLE_BY_HAND:
            return None
        now = self.clock.now()
        deadline = (
            micros(now + dt.timedelta(milliseconds=before.max_duration_millis))
            if before.max_duration_millis
            else ""
        )
        if from_step is not None and self.sharded and before.depends_on:
            # Refused before the edges below are linked again (retry.lua checks once more).
            self._check_step(task_id, from_step, shard)
        remote = (
            self._link_for_retry(task_id, before.depends_on, shard)
            if self.sharded and before.depends_on
            else {}
        )
        reply = self._run(
            "retry",
            task_id,
            before.status.value,
            deadline,
            json.dumps(remote) if remote else "",
            micros(WAITING_RUN_AT),
            from_step or "",
            now=now,
            shard=shard,
        )
        if reply is None:
            return None
        if text(reply[0]) == "nostep":
            assert from_step is not None
            known = [name for name, _, _ in stored_steps(fields(reply[1]))]
            raise UnknownStepError(task_id, from_step, known)
        if text(reply[0]) == "held":
            raise AttemptStillRunningError(
                task_id, text(reply[1]) or None, from_micros(text(reply[2]))
            )
        if text(reply[0]) == "depfailed":
            raise DependencyNotCompletedError(task_id, text(reply[1]), text(reply[2]) or None)
        info = to_info(task_id, fields(reply[1]))
        if remote and info.waiting_for:
            self._settle_ended_meanwhile(info.task_id, info.waiting_for, remote, shard)
        return Transition(task=info, previous=before.status)

    def _check_step(self, task_id: str, from_step: str, shard: int) -> None:
        """UnknownStepError when the task has no checkpoint of ``from_step``."""
        steps = self.client.hgetall(self.prefixes[shard] + "steps:" + task_id)
        known = [name for name, _, _ in stored_steps(steps)]
        if from_step not in known:
            raise UnknownStepError(task_id, from_step, known)

    def _link_for_retry(
        self, task_id: str, depends_on: Sequence[str], shard: int
    ) -> dict[str, str]:
        """Sharded: the status of each dependency of ``task_id`` (stored on ``shard``) that is
        stored on another shard: '' when live there, where dep_link.lua has registered the
        edge again (its ending then sends a message), '-' when stored nowhere (purged)."""
        elsewhere = [d for d in depends_on if not self.client.exists(self._tkey(d, shard))]
        remote: dict[str, str] = {}
        for dependency in elsewhere:
            home = next(
                (
                    other
                    for other in range(len(self.prefixes))
                    if other != shard and self.client.exists(self._tkey(dependency, other))
                ),
                None,
            )
            if home is None:
                remote[dependency] = "-"
                continue
            [status] = self._run("dep_link", shard, task_id, dependency, shard=home)
            status = text(status)
            remote[dependency] = "" if status in LIVE_VALUES else status or "-"
        return remote

    def _settle_ended_meanwhile(
        self, task_id: str, waiting_for: Sequence[str], remote: dict[str, str], shard: int
    ) -> None:
        """Sharded: a remote dependency live when read, ended before the retry was written,
        sent its outcome to a task not waiting yet, which left it alone. Read them again now
        that it waits, and settle it with each that has ended (settle_dependent changes it
        only while it awaits that one: an outcome that also came by message counts once)."""
        for dependency in waiting_for:
            if remote.get(dependency) != "":
                continue
            again = self._link_for_retry(task_id, [dependency], shard).get(dependency, "")
            if again not in ("", "-"):
                message = {"k": "dep", "id": task_id, "d": dependency, "s": again, "m": "0"}
                self._apply([json.dumps(message)], shard)

    @guarded
    def heartbeat(
        self, worker_id: str, tokens: Mapping[str, int], lease_seconds: float
    ) -> dict[str, tuple[int, bool]]:
        if not tokens:
            return {}
        now = self.clock.now()
        lease_until = micros(now + dt.timedelta(seconds=lease_seconds))
        if self.sharded:
            return self._heartbeat_shards(worker_id, tokens, lease_until, now)
        return self._beat(worker_id, tokens, lease_until, now, {CONTROL_SHARD: list(tokens)})

    def _heartbeat_shards(
        self, worker_id: str, tokens: Mapping[str, int], lease_until: str, now: dt.datetime
    ) -> dict[str, tuple[int, bool]]:
        """Sharded heartbeat: each task to the shard it was claimed on, not to every shard.
        That is its id's directory shard (a generated id's is its queue's), or for a given id
        stored off it the shard noted when it was claimed here; a task that shard does not
        hold (a lost lease, a note dropped) is asked of the other shards in a second step."""
        with self._held_lock:
            foreign = {t: self._held_on[t] for t in tokens if t in self._held_on}
            self._held_on = foreign  # the claims no longer beaten are gone
        guessed: dict[int, list[str]] = {}
        for task_id in tokens:
            shard = foreign.get(task_id, directory_of(task_id, self.layout.shards))
            guessed.setdefault(shard, []).append(task_id)
        held = self._beat(worker_id, tokens, lease_until, now, guessed)
        missing = [task_id for task_id in tokens if task_id not in held]
        if missing:
            tried = {t: s for s, ids in guessed.items() for t in ids}
            others: dict[int, list[str]] = {}
            for task_id in missing:
                for shard in range(len(self.prefixes)):
                    if shard != tried[task_id]:
                        others.setdefault(shard, []).append(task_id)
            held.update(self._beat(worker_id, tokens, lease_until, now, others))
        return held

    def _beat(
        self,
        worker_id: str,
        tokens: Mapping[str, int],
        lease_until: str,
        now: dt.datetime,
        by_shard: dict[int, list[str]],
    ) -> dict[str, tuple[int, bool]]:
        return {
            text(task_id): (int(token), text(cancel) == "1")
            for shard, ids in sorted(by_shard.items())
            for task_id, token, cancel in self._run(
                "heartbeat",
                worker_id,
                lease_until,
                *(value for task_id in ids for value in (task_id, tokens[task_id])),
                now=now,
                shard=shard,
            )
        }
