"""A reference model of the task store in plain Python: the executable form of docs/guarantees.md.

It holds what a storage promises about tasks — statuses, claims under leases and fencing
tokens, attempts and retries, cancel requests, deadlines, dependencies, batches, unique keys
and paused queues — and nothing about how any storage keeps it. tests/model/test_protocol.py
drives it beside a real storage and compares the two after every step.

"Ended" is DESIGN.md §6.1's: a task has ended when its status is terminal *and* no handler of
it may still run (no lease is held on it, or the lease lapsed). Every rule that waits for an
ending (dependencies, batch callbacks, unique keys, manual retry, purge) asks ``ended``.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import os
from collections.abc import Callable

ALL = frozenset({"sqlite", "mariadb", "postgres", "redis"})
DATABASES = frozenset({"sqlite", "mariadb", "postgres"})

# Rules of DESIGN.md §6.1 and issue 30 that this branch's storages do not keep yet, and on
# which storages. While an entry is here, the model follows the code for that one rule on
# those storages (see ``ended``, ``retry`` and ``submit``) so that the test passes; the
# merger deletes the entry once the fix is merged, and the model then demands the rule.
KNOWN_UNTIL_MERGED: dict[str, frozenset[str]] = {
    # Issue 30 defects 4 (a TIMEOUT whose handler still runs counted as ended) and 13 (a
    # retried dependent ran at once) were listed here until their fixes landed; the model now
    # demands both rules on every storage.
    # Found by this test (the databases, a call without dependencies): a unique submit naming
    # an existing task_id took the key for that task, or answered with the key's holder;
    # fixed in Submitting._enqueue_keyed, demanded since.
}
# RE_MODEL_STRICT=name,...: demand these rules anyway (bench/mutants.py shows the test
# catching the defects still in the code this way).
for _name in filter(None, os.environ.get("RE_MODEL_STRICT", "").split(",")):
    KNOWN_UNTIL_MERGED.pop(_name, None)

TERMINAL = frozenset({"COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "ERROR"})
# Where a wait for an event without a timeout sits until the event comes (never due by time).
NEVER = dt.datetime(9000, 1, 1, tzinfo=dt.UTC)
RETRYABLE_BY_HAND = frozenset({"FAILED", "TIMEOUT", "CANCELLED", "ERROR"})


class Refused(Exception):
    """The model refuses this call (the storage must raise, storing nothing)."""


class StillRunning(Exception):
    """A manual retry refused while the previous attempt's handler may still run."""


@dataclasses.dataclass
class Lease:
    """A claim held on a task: by ``worker``, under ``claim`` (the fencing token's stand-in: the
    model numbers claims, the storage numbers tokens), until ``until``."""

    worker: str
    claim: int
    until: dt.datetime
    started: bool = False


@dataclasses.dataclass
class Task:
    task_id: str
    queue: str
    created_at: dt.datetime
    run_at: dt.datetime
    retry_limit: int
    retry_interval_ms: int
    max_duration_ms: int | None
    deadline: dt.datetime | None
    status: str = "CREATED"
    attempts: int = 0
    budget: int = 0  # attempts against the current retry budget (a manual retry resets it)
    cancel_requested: bool = False
    lease: Lease | None = None
    finished_at: dt.datetime | None = None
    depends_on: tuple[str, ...] = ()
    waiting_for: set[str] = dataclasses.field(default_factory=set)
    on_dependency_failure: str = "cancel"
    batch_id: str | None = None
    unique_key: str | None = None
    unique_until: dt.datetime | None = None
    # A durable wait (context.sleep / wait_for_event, or a stop at a step): its kind while the
    # task waits, PENDING with no lease; the events sent to it; how often it was handed back.
    waiting: str | None = None
    wait_event: str | None = None
    events: set[str] = dataclasses.field(default_factory=set)
    resumptions: int = 0


@dataclasses.dataclass
class Batch:
    batch_id: str
    members: list[str]
    on_complete: bool
    on_success: bool
    finished: bool = False
    counted: dict[str, str] = dataclasses.field(default_factory=dict)  # member -> its ending
    callbacks: list[str] = dataclasses.field(default_factory=list)  # "complete", "success"


@dataclasses.dataclass
class Spec:
    """One submit request as the model sees it."""

    task_id: str
    queue: str = "q1"
    delay_s: float = 0
    retry_limit: int = 1
    max_duration_ms: int | None = None
    depends_on: tuple[str, ...] = ()
    on_dependency_failure: str = "cancel"
    unique_key: str | None = None
    unique_for_s: float = 100.0


class Model:
    """The store's promises. Times come from the caller (the test's fake clock)."""

    def __init__(self, lease_s: float, storage: str) -> None:
        self.lease_s = lease_s
        #: The entries of KNOWN_UNTIL_MERGED that hold for this storage.
        self.known = {name for name, where in KNOWN_UNTIL_MERGED.items() if storage in where}
        self.tasks: dict[str, Task] = {}
        self.batches: dict[str, Batch] = {}
        self.paused: set[str] = set()
        self.next_claim = 0
        self.purged: set[str] = set()
        # Each unique key's last taker and the end of its window.
        self.keys: dict[str, tuple[str, dt.datetime]] = {}

    # -- what "ended" means (§6.1) -------------------------------------------------------
    def handler_may_run(self, task: Task, now: dt.datetime) -> bool:
        """A started attempt's lease is held and has not lapsed: its handler may still run."""
        return task.lease is not None and task.lease.started and task.lease.until > now

    def ended(self, task: Task, now: dt.datetime) -> bool:
        """Terminal, and its handler returned or its worker is gone (§6.1): a lease kept by a
        timed-out handler ends when that handler's return is written or, once it lapsed, when
        the master's recovery finds it (recover_expired), which settles its dependents, batch
        and unique key in the same step."""
        if task.status not in TERMINAL:
            return False
        return task.lease is None or not task.lease.started

    # -- submitting -----------------------------------------------------------------------
    def unique_holder(self, key: str, now: dt.datetime) -> Task | None:
        """The task holding ``key``: the last to take it, while its window lasts and it has
        not ended (a holder retried by hand is live again, unless another took the key)."""
        if key not in self.keys:
            return None
        task_id, until = self.keys[key]
        task = self.tasks.get(task_id)
        if task is None or until <= now or self.ended(task, now):
            return None
        return task

    def submit(self, specs: list[Spec], now: dt.datetime, batch_id: str | None = None) -> list[str]:
        """Store ``specs`` all or nothing; the id each request answers with, in order. Each
        request is settled as if submitted alone after the ones before it: a task of the call
        cancelled at once (a dependency already failed) has ended, and frees its unique key
        for a later request of the call."""
        for spec in specs:
            if spec.task_id in spec.depends_on:
                raise Refused(f"{spec.task_id} depends on itself")
        saved = copy.deepcopy(self.__dict__)
        try:
            return [self._submit_one(spec, now, batch_id) for spec in specs]
        except Refused:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def _submit_one(self, spec: Spec, now: dt.datetime, batch_id: str | None) -> str:
        if spec.task_id in self.tasks:
            if batch_id is not None:
                raise Refused(f"batch member {spec.task_id} exists")
            return spec.task_id
        if spec.unique_key is not None:
            holder = self.unique_holder(spec.unique_key, now)
            if holder is not None:
                return holder.task_id
        for dep in spec.depends_on:
            if dep not in self.tasks:
                raise Refused(f"{spec.task_id} depends on unknown {dep}")
        deadline = (
            now + dt.timedelta(milliseconds=spec.max_duration_ms) if spec.max_duration_ms else None
        )
        task = Task(
            task_id=spec.task_id,
            queue=spec.queue,
            created_at=now,
            run_at=now + dt.timedelta(seconds=spec.delay_s),
            retry_limit=spec.retry_limit,
            retry_interval_ms=1000,
            max_duration_ms=spec.max_duration_ms,
            deadline=None if spec.depends_on else deadline,  # counted from its release
            depends_on=spec.depends_on,
            on_dependency_failure=spec.on_dependency_failure,
            batch_id=batch_id,
        )
        if spec.unique_key is not None:
            task.unique_key = spec.unique_key
            task.unique_until = now + dt.timedelta(seconds=spec.unique_for_s)
            self.keys[spec.unique_key] = (spec.task_id, task.unique_until)
        self.tasks[task.task_id] = task
        task.waiting_for = set(task.depends_on)
        self._settle_dependent(task, now)  # a dependency stored by this call may already wait
        return spec.task_id

    def submit_batch(
        self,
        batch_id: str,
        specs: list[Spec],
        now: dt.datetime,
        on_complete: bool,
        on_success: bool,
    ) -> None:
        if batch_id in self.batches:
            raise Refused(f"batch {batch_id} exists")
        self.submit(specs, now, batch_id=batch_id)
        self.batches[batch_id] = Batch(
            batch_id, [s.task_id for s in specs], on_complete, on_success
        )
        self.settle(now)

    # -- the worker's path ------------------------------------------------------------------
    def claimable(self, task: Task, now: dt.datetime) -> bool:
        return (
            task.status in ("CREATED", "PENDING")
            and task.lease is None
            and not task.waiting_for
            and task.run_at <= now
            and task.queue not in self.paused
        )

    def claim(self, task_id: str, worker: str, now: dt.datetime) -> int:
        task = self.tasks[task_id]
        assert self.claimable(task, now), task
        self.next_claim += 1
        task.lease = Lease(worker, self.next_claim, now + dt.timedelta(seconds=self.lease_s))
        task.waiting = task.wait_event = None  # resumed now
        return self.next_claim

    def holds(self, task_id: str, claim: int) -> bool:
        task = self.tasks.get(task_id)
        return task is not None and task.lease is not None and task.lease.claim == claim

    def start(self, task_id: str, claim: int, now: dt.datetime) -> bool:
        task = self.tasks.get(task_id)
        if (
            task is None
            or not self.holds(task_id, claim)
            or task.lease is None
            or task.lease.started
            or task.status not in ("CREATED", "PENDING")
        ):
            return False
        task.status = "RUNNING"
        task.attempts += 1
        task.budget += 1
        task.lease.started = True
        task.lease.until = now + dt.timedelta(seconds=self.lease_s)
        return True

    def expire_claim(self, task_id: str, claim: int, now: dt.datetime) -> bool:
        """A claim past its deadline before it started: TIMEOUT without running it."""
        task = self.tasks.get(task_id)
        if (
            task is None
            or not self.holds(task_id, claim)
            or task.status not in ("CREATED", "PENDING")
        ):
            return False
        self._end(task, "TIMEOUT", now)
        return True

    def release(self, task_id: str, claim: int) -> bool:
        """An unstarted claim handed back: claimable again, no attempt counted, the claim
        fenced off."""
        task = self.tasks.get(task_id)
        if (
            task is None
            or not self.holds(task_id, claim)
            or task.lease is None
            or task.status not in ("CREATED", "PENDING")
        ):
            return False
        task.lease = None
        return True

    def heartbeat(self, worker: str, claims: dict[str, int], now: dt.datetime) -> set[str]:
        """Renew the leases ``worker`` holds under these claims; the ids still held."""
        held = set()
        for task_id, claim in claims.items():
            task = self.tasks.get(task_id)
            if task is None or not self.holds(task_id, claim) or task.lease is None:
                continue
            if task.status in TERMINAL and not task.lease.started:
                continue
            task.lease.until = now + dt.timedelta(seconds=self.lease_s)
            held.add(task_id)
        return held

    def complete(self, task_id: str, claim: int, now: dt.datetime) -> bool:
        task = self.tasks.get(task_id)
        if task is None or not self.holds(task_id, claim) or task.status != "RUNNING":
            return False
        self._end(task, "COMPLETED", now)
        return True

    def fail(self, task_id: str, claim: int, now: dt.datetime, retryable: bool) -> str | None:
        task = self.tasks.get(task_id)
        if task is None or not self.holds(task_id, claim) or task.status != "RUNNING":
            return None
        return self._failed_attempt(task, now, retryable)

    def suspend(
        self,
        task_id: str,
        claim: int,
        now: dt.datetime,
        kind: str | None,
        *,
        until: dt.datetime | None = None,
        event: str | None = None,
    ) -> bool:
        """A running attempt stops at a durable wait (``kind`` "sleep" or "event"; None: a stop
        at a step, due again now): PENDING without a lease, the attempt given back, a
        resumption counted; due at the sleep's end or the event's timeout, or at once for an
        event sent already. Refused under a stale claim, or once a cancel was requested."""
        task = self.tasks.get(task_id)
        if (
            task is None
            or not self.holds(task_id, claim)
            or task.status != "RUNNING"
            or task.cancel_requested
        ):
            return False
        task.status = "PENDING"
        task.lease = None
        task.attempts -= 1
        task.budget -= 1
        task.resumptions += 1
        task.waiting, task.wait_event = kind, event
        if kind is None or (kind == "event" and event in task.events):
            task.run_at = now
        else:
            task.run_at = until or NEVER
        return True

    def send_event(self, task_id: str, name: str, now: dt.datetime) -> bool:
        """Kept (the first payload) for a live task; a task waiting for it is due now."""
        task = self.tasks.get(task_id)
        if task is None or task.status in TERMINAL:
            return False
        task.events.add(name)
        if task.status == "PENDING" and task.waiting == "event" and task.wait_event == name:
            task.run_at = now
        return True

    def _failed_attempt(self, task: Task, now: dt.datetime, retryable: bool) -> str:
        """After a failed attempt: a cancel request wins, then the deadline, then the budget."""
        if task.cancel_requested:
            status = "CANCELLED"
        elif task.deadline is not None and now >= task.deadline:
            status = "TIMEOUT"
        elif retryable and task.budget <= task.retry_limit:
            task.status = "PENDING"
            task.lease = None
            task.run_at = now + dt.timedelta(milliseconds=task.retry_interval_ms)
            return "PENDING"
        else:
            status = "FAILED"
        self._end(task, status, now)
        return status

    def _end(self, task: Task, status: str, now: dt.datetime, keep_lease: bool = False) -> None:
        task.status = status
        task.finished_at = now
        if not keep_lease:
            task.lease = None
        self.settle(now)

    # -- operating --------------------------------------------------------------------------
    def cancel(self, task_id: str, now: dt.datetime) -> bool:
        task = self.tasks.get(task_id)
        if task is None:
            return False
        if task.status in ("CREATED", "PENDING"):
            task.waiting_for = set()
            self._end(task, "CANCELLED", now)  # an unstarted claim is fenced off
            return True
        if task.status == "RUNNING":
            task.cancel_requested = True
            return True
        return False

    def retry(self, task_id: str, now: dt.datetime) -> bool:
        """FAILED/TIMEOUT/ERROR/CANCELLED -> PENDING due now, fresh budget and deadline, any claim
        fenced off; refused (StillRunning) while the previous attempt's handler may run. A
        dependent retried waits for its dependencies to complete, and is refused when one ended
        otherwise (unless on_dependency_failure="run")."""
        task = self.tasks.get(task_id)
        if task is None or task.status not in RETRYABLE_BY_HAND:
            return False
        if self.handler_may_run(task, now):
            raise StillRunning(task_id)
        if task.lease is not None:
            # A kept lease that lapsed, not yet recovered: its attempt ended (§6.1) before
            # the retry, and what waited for it learns so first, as after the master's
            # recovery (a dependent of a TIMEOUT is cancelled, say): the outcome does not
            # depend on whether the recovery came before the retry.
            task.lease = None
            self.settle(now)
        waiting: set[str] = set()
        if "retried-dependent-runs-at-once" not in self.known:
            for dep_id in task.depends_on:
                dep = self.tasks.get(dep_id)
                if dep is not None and not self.ended(dep, now):
                    waiting.add(dep_id)
                elif (dep is None or dep.status != "COMPLETED") and (
                    task.on_dependency_failure != "run"
                ):
                    return False  # purged, or ended otherwise: refused, saying why
        # One still to end: it waits again as at its submit (CREATED, its deadline counted
        # from its release); else due now.
        task.status = "CREATED" if waiting else "PENDING"
        task.run_at = now
        task.deadline = (
            now + dt.timedelta(milliseconds=task.max_duration_ms)
            if task.max_duration_ms and not waiting
            else None
        )
        task.budget = 0
        task.cancel_requested = False
        task.finished_at = None
        task.lease = None
        task.waiting_for = waiting
        task.waiting = task.wait_event = None
        if task.batch_id in self.batches:
            self.batches[task.batch_id].counted.pop(task_id, None)
        return True

    def pause(self, queue: str) -> bool:
        was = queue in self.paused
        self.paused.add(queue)
        return not was

    def resume(self, queue: str) -> bool:
        was = queue in self.paused
        self.paused.discard(queue)
        return was

    # -- the master's chores ----------------------------------------------------------------
    def recover_expired(self, now: dt.datetime) -> None:
        """Lapsed leases: unstarted claims go back (no attempt); started ones count a failed
        attempt ("worker lost", retried whatever retry_on says). A timed-out task's lapsed
        lease is simply gone."""
        for task in list(self.tasks.values()):
            lease = task.lease
            if lease is None or lease.until > now:
                continue
            if task.status in ("CREATED", "PENDING"):
                task.lease = None
            elif task.status == "RUNNING":
                self._failed_attempt(task, now, retryable=True)
            else:
                task.lease = None
        self.settle(now)

    def expire_overdue(self, now: dt.datetime) -> None:
        """Live tasks past their deadline -> TIMEOUT; a running one keeps its holder's lease."""
        for task in list(self.tasks.values()):
            if task.deadline is None or task.deadline > now or task.status in TERMINAL:
                continue
            running = task.status == "RUNNING"
            task.waiting_for = set()
            self._end(task, "TIMEOUT", now, keep_lease=running)

    def purge(self, before: dt.datetime, now: dt.datetime, stored: Callable[[str], bool]) -> None:
        """Terminal tasks finished before ``before`` whose handler no longer runs. A lease that
        lapsed but was not recovered yet may keep its task or not (``stored`` says which the
        storage did): both are safe."""
        for task_id, task in list(self.tasks.items()):
            # Purge keeps a timed-out task whose handler runs on every storage already.
            ended = task.status in TERMINAL and not self.handler_may_run(task, now)
            if ended and task.lease is not None and stored(task_id):
                continue
            if ended and task.finished_at is not None and task.finished_at < before:
                del self.tasks[task_id]
                self.purged.add(task_id)

    # -- dependencies and batches settle on every ending ------------------------------------
    def settle(self, now: dt.datetime) -> None:
        """Dependents whose dependencies ended, and batches whose members all ended, until
        nothing changes (a cascaded cancel can end more tasks)."""
        changed = True
        while changed:
            changed = False
            for task in list(self.tasks.values()):
                if task.waiting_for and task.status == "CREATED":
                    changed |= self._settle_dependent(task, now)
            for batch in self.batches.values():
                changed |= self._settle_batch(batch, now)

    def _settle_dependent(self, task: Task, now: dt.datetime) -> bool:
        if task.status != "CREATED" or not task.waiting_for:
            return False
        before = set(task.waiting_for)
        for dep_id in sorted(before):
            dep = self.tasks.get(dep_id)
            if dep is None or not self.ended(dep, now):
                continue
            task.waiting_for.discard(dep_id)
            if dep.status != "COMPLETED" and task.on_dependency_failure == "cancel":
                task.waiting_for = set()
                task.run_at = now
                self._end(task, "CANCELLED", now)
                return True
        if not task.waiting_for and before:
            # Released: due now, and its max duration counts from now (docs/workflows.md).
            task.run_at = now
            task.deadline = (
                now + dt.timedelta(milliseconds=task.max_duration_ms)
                if task.max_duration_ms
                else None
            )
        return task.waiting_for != before

    def _settle_batch(self, batch: Batch, now: dt.datetime) -> bool:
        for member_id in batch.members:
            task = self.tasks.get(member_id)
            if task is not None and self.ended(task, now):
                batch.counted[member_id] = task.status
        if batch.finished or len(batch.counted) < len(batch.members):
            return False
        batch.finished = True  # callbacks once, never again (a retried member reopens none)
        if batch.on_complete:
            batch.callbacks.append("complete")
        if batch.on_success and all(s == "COMPLETED" for s in batch.counted.values()):
            batch.callbacks.append("success")
        return True

    def batch_counts(self, batch: Batch) -> dict[str, int]:
        ended = list(batch.counted.values())
        counts = {
            "total": len(batch.members),
            "completed": ended.count("COMPLETED"),
            "cancelled": ended.count("CANCELLED"),
        }
        counts["failed"] = len(ended) - counts["completed"] - counts["cancelled"]
        counts["pending"] = counts["total"] - len(ended)
        return counts
