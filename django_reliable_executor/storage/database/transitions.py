"""The task transitions of the database storage: start, heartbeat, complete, fail, expire, release,
cancel and retry, each one conditional UPDATE fenced by the claim's token."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Mapping, Sequence

from django.db import connections
from django.db.models import F, Q

from ...core.records import CancelResult, Claim, TaskInfo, Transition
from ...core.retries import failure_outcome, timeout_message
from ...core.serialization import encoded
from ...core.states import RETRYABLE_BY_HAND, TaskStatus
from ...models import ReliableTask
from . import rate_starts
from .access import DatabaseAccess
from .dependencies import json_ids
from .lease_renewal import renew_skipping_locked
from .retry_counts import add_retries
from .retrying import retry_plain_rows, retry_row
from .rows import (
    NOT_WAITING,
    OR_CHUNK,
    WAITING,
    chunks,
    claimed_by_holders,
    claims_match,
    failure_changes,
    held_by_claims,
    holding_sql,
)
from .step_rows import discard_steps, first_discarded


class Transitions(DatabaseAccess):
    """Every change of one task's state after it was stored, each a compare-and-set."""

    def start(self, claim: Claim, lease_seconds: float) -> Claim | None:
        return self.start_many([claim], lease_seconds)[0]

    def start_many(self, claims: Sequence[Claim], lease_seconds: float) -> list[Claim | None]:
        """One UPDATE for the batch; which rows it changed is read back only on a partial hit.

        Hand-written SQL: this runs once per task, and building the same statement through the
        ORM cost more CPU than the round trip itself. Claims of rate-limited names that waited
        long in their worker move their log entries first (rate_starts.py).
        """
        return rate_starts.start_many(self, claims, lease_seconds)

    def _start_at(
        self, claims: Sequence[Claim], lease_seconds: float, now: dt.datetime
    ) -> list[Claim | None]:
        """start_many with ``now`` as the start time: a rate-limited start that moved its log
        entry writes the entry's time, so the stored start is the one the limit counted."""
        if not claims:
            return []
        if len(claims) > OR_CHUNK:  # (SQLite refuses an expression tree 1000 deep)
            return [
                started
                for part in chunks(list(claims), OR_CHUNK)
                for started in self._start_at(part, lease_seconds, now)
            ]
        held_sql, held_params = claimed_by_holders(claims)
        changed = self._execute(
            f"UPDATE {self._table} SET status = %s, attempts = attempts + 1, "
            "budget_attempts = budget_attempts + 1, started_at = %s, lease_expires_at = %s "
            # The claim must still be held: same token (releasing, recovering, cancelling and
            # retrying bump it), still claimed, by this worker. "Not yet started" is written
            # as NOT IN so that no planner is tempted by the status index on stale
            # statistics: the primary key must drive this.
            f"WHERE status NOT IN ({', '.join(['%s'] * len(NOT_WAITING))}) AND ({held_sql})",
            [
                TaskStatus.RUNNING.value,
                self._dt(now),
                self._dt(now + dt.timedelta(seconds=lease_seconds)),
                *NOT_WAITING,
                *held_params,
            ],
        )
        started = self._hits(
            claims, changed, TaskStatus.RUNNING, "started_at", now, held_sql, held_params
        )
        return [claim.started(now) if claim.task_id in started else None for claim in claims]

    def heartbeat(
        self, worker_id: str, tokens: Mapping[str, int], lease_seconds: float
    ) -> dict[str, tuple[int, bool]]:
        """One UPDATE per chunk renews the leases held under these exact tokens, one SELECT
        reads back which are held (and their cancel flags); on PostgreSQL see
        lease_renewal.py."""
        held: dict[str, tuple[int, bool]] = {}
        lease_until = self.clock.now() + dt.timedelta(seconds=lease_seconds)
        for chunk in chunks(list(tokens.items())):
            sql, params = holding_sql(worker_id, chunk)
            if self.vendor == "postgresql":
                with connections[self.alias].cursor() as cursor:
                    until = self._dt(lease_until)
                    renew_skipping_locked(cursor, self._table, worker_id, chunk, until)
            else:  # MariaDB reads the IN list in key order, as its other writes; SQLite: one writer
                self._execute(
                    f"UPDATE {self._table} SET lease_expires_at = %s WHERE {sql}",
                    [self._dt(lease_until), *params],
                )
            with connections[self.alias].cursor() as cursor:
                cursor.execute(
                    f"SELECT task_id, lease_token, cancel_requested, status FROM {self._table} "
                    f"WHERE {sql}",
                    params,
                )
                for task_id, token, cancel, status in cursor.fetchall():
                    # Timed out while its handler runs: still held, and the handler should stop.
                    held[task_id] = (token, bool(cancel) or status == TaskStatus.TIMEOUT.value)
        return held

    def complete(self, claim: Claim, result: object) -> Transition | None:
        return self.complete_many([(claim, result)])[0]

    def complete_many(self, outcomes: Sequence[tuple[Claim, object]]) -> list[Transition | None]:
        """One UPDATE per batch (results picked per row with CASE when they differ), split so
        that no statement carries more than a few MiB of results. Raises ValueError, writing
        nothing, when one result is larger than the database takes in one statement."""
        if not outcomes:
            return []
        now = self.clock.now()
        results = [encoded(result) for _, result in outcomes]  # a worker's are encoded already
        # JSON null is stored as SQL NULL, as the model field does.
        texts = [None if result.text == "null" else result.text for result in results]

        def refuse(index: int, why: str) -> Exception:
            return ValueError(f"the result of task {outcomes[index][0].task_id!r} is {why}")

        transitions: list[Transition | None] = []
        for span in self._spans(texts, refuse):
            claims = [claim for claim, _ in outcomes[span]]
            done = self._complete_span(claims, texts[span], now)
            transitions += [
                claim.completed(result.value, now) if claim.task_id in done else None
                for claim, result in zip(claims, results[span], strict=True)
            ]
        return transitions

    def _complete_span(
        self, claims: Sequence[Claim], texts: Sequence[str | None], now: dt.datetime
    ) -> set[str]:
        """Complete these claims; returns the ids completed.

        The hot path: no claim had dependents when claimed and none is a batch member. Then
        one UPDATE alone, no transaction, which completes only the rows that still have no
        dependents (has_dependents is set by the submit of a dependent, under a lock of this
        row: a completion waiting for that lock reads the flag it wrote). The rest, and any
        span with dependents or batch members, complete with their settling in a transaction.
        """
        if any(c.has_dependents or c.task.batch_id is not None for c in claims):
            return self._ending(functools.partial(self._complete_settled, claims, texts, now))
        done = self._alone(functools.partial(self._complete_rows, claims, texts, now, True))
        if len(done) == len(claims):
            return done
        # Lost claims, or dependents stored since the claim: the full path sorts them out.
        rest = [i for i, claim in enumerate(claims) if claim.task_id not in done]
        return done | self._ending(
            functools.partial(
                self._complete_settled, [claims[i] for i in rest], [texts[i] for i in rest], now
            )
        )

    def _complete_settled(
        self, claims: Sequence[Claim], texts: Sequence[str | None], now: dt.datetime
    ) -> set[str]:
        """``_complete_rows``, then the dependents and batches of the tasks it completed are
        settled (in the caller's transaction)."""
        done = self._complete_rows(claims, texts, now)
        if done:
            status = TaskStatus.COMPLETED.value
            self._settle_endings(
                [(c.task.batch_id, c.task_id, status) for c in claims if c.task_id in done]
            )
        return done

    def _complete_rows(
        self,
        claims: Sequence[Claim],
        texts: Sequence[str | None],
        now: dt.datetime,
        alone: bool = False,
    ) -> set[str]:
        """One UPDATE of these claims to COMPLETED; returns the ids it changed. ``alone``:
        only rows without dependents (their ending needs nothing else)."""
        if len(claims) > OR_CHUNK:
            done: set[str] = set()
            for start in range(0, len(claims), OR_CHUNK):
                end = start + OR_CHUNK
                done |= self._complete_rows(claims[start:end], texts[start:end], now, alone)
            return done
        # Written as JSON text (the worker serialised it once); PostgreSQL casts it to jsonb.
        value_sql = "CAST(%s AS jsonb)" if self.vendor == "postgresql" else "%s"
        if all(text == texts[0] for text in texts):  # JSON equality: 1 and True differ
            result_sql = value_sql
            result_params: list[object] = [texts[0]]
        else:
            result_sql = "CASE task_id " + f"WHEN %s THEN {value_sql} " * len(claims) + "END"
            result_params = []
            for claim, text in zip(claims, texts, strict=True):
                result_params += [claim.task_id, text]
        held_sql, held_params = held_by_claims(claims)
        alone_sql = " AND has_dependents = %s" if alone else ""
        changed = self._execute(
            f"UPDATE {self._table} SET status = %s, result = {result_sql}, finished_at = %s, "
            f"lease_expires_at = NULL, deadline_at = NULL WHERE status = %s AND ({held_sql})"
            f"{alone_sql}",
            [
                TaskStatus.COMPLETED.value,
                *result_params,
                self._dt(now),
                TaskStatus.RUNNING.value,
                *held_params,
                *([False] if alone else []),
            ],
        )
        return self._hits(
            claims, changed, TaskStatus.COMPLETED, "finished_at", now, held_sql, held_params
        )

    def fail(
        self, claim: Claim, error: str, *, retryable: bool, is_error: bool = False
    ) -> Transition | None:
        now = self.clock.now()
        if is_error:
            # ERROR does not depend on the cancel flag: one CAS on state and token.
            return self._record_failure(claim, TaskStatus.ERROR, None, error, now, None)
        # Optimistic: assume no cancel was requested; if the CAS misses, decide again with it.
        for cancel_requested in (False, True):
            status, run_at = failure_outcome(
                claim,
                now,
                self.backoff_cap_millis,
                retryable=retryable,
                cancel_requested=cancel_requested,
            )
            transition = self._record_failure(claim, status, run_at, error, now, cancel_requested)
            if transition is not None:
                if transition.status is TaskStatus.PENDING:
                    add_retries(self.alias, now, 1)
                if run_at is not None and run_at <= now:  # a retry due at once
                    self._work_committed([claim.task.queue])
                return transition
        return None

    def _record_failure(
        self,
        claim: Claim,
        status: TaskStatus,
        run_at: dt.datetime | None,
        error: str,
        now: dt.datetime,
        cancel_requested: bool | None,
    ) -> Transition | None:
        """CAS RUNNING (with this token, and this cancel flag unless None) -> ``status``."""
        changes = failure_changes(status, run_at, error, now)
        if not status.is_terminal:  # a retry: nothing to settle
            changed = self._alone(
                functools.partial(self._fail_row, claim, changes, cancel_requested, False)
            )
        elif not claim.has_dependents and claim.task.batch_id is None:
            # The hot path, as for completions: one UPDATE alone, of a row still without
            # dependents; a dependent stored since the claim (or a lost claim) takes the full
            # path below.
            changed = self._alone(
                functools.partial(self._fail_row, claim, changes, cancel_requested, True)
            )
        else:
            changed = 0
        if not changed and status.is_terminal:
            match = Q(pk=claim.task_id, lease_token=claim.token, status=TaskStatus.RUNNING.value)
            if cancel_requested is not None:
                match &= Q(cancel_requested=cancel_requested)
            batch_id = claim.task.batch_id
            changed = self._ending(
                lambda: self._end(match, changes, claim.task_id, status, batch_id)
            )
        if not changed:
            return None
        task = dataclasses.replace(
            claim.task,
            status=status,
            last_error=error,
            run_at=run_at or claim.task.run_at,
            finished_at=changes.get("finished_at"),
            cancel_requested=bool(cancel_requested),
            handler_running=False,
        )
        return Transition(task=task, previous=TaskStatus.RUNNING)

    def _fail_row(
        self,
        claim: Claim,
        changes: Mapping[str, object],
        cancel_requested: bool | None,
        alone: bool,
    ) -> int:
        """One hand-written UPDATE of a failed attempt's row (RUNNING with the claim's token,
        this cancel flag unless None; ``alone``: only while it has no dependents) with
        ``changes``. Hand-written: a queryset's update compiled per failure cost more Python
        time than the rest of the failure."""
        sets = []
        params: list[object] = []
        for column, value in changes.items():
            if value is None:
                sets.append(f"{column} = NULL")
            else:
                sets.append(f"{column} = %s")
                params.append(self._dt(value) if isinstance(value, dt.datetime) else value)
        where = "task_id = %s AND lease_token = %s AND status = %s"
        params += [claim.task_id, claim.token, TaskStatus.RUNNING.value]
        if cancel_requested is not None:
            where += " AND cancel_requested = %s"
            params.append(cancel_requested)
        if alone:
            where += " AND has_dependents = %s"
            params.append(False)
        return self._execute(f"UPDATE {self._table} SET {', '.join(sets)} WHERE {where}", params)

    def _end(
        self,
        match: Q,
        changes: dict[str, object],
        task_id: str,
        status: TaskStatus,
        batch_id: str | None,
    ) -> int:
        """UPDATE the row ``match`` finds with ``changes`` (which end it in ``status``) and
        settle its dependents and its batch (``batch_id``), in the caller's transaction (see
        ``_ending``)."""
        changed = self._tasks().filter(match).update(**changes)
        if changed:
            self._settle_endings([(batch_id, task_id, status.value)])
        return changed

    def expire_claim(self, claim: Claim) -> Transition | None:
        now = self.clock.now()
        error = timeout_message(claim.task.max_duration_millis, claim.task.last_error)
        match = Q(pk=claim.task_id, lease_token=claim.token, available=False, status__in=WAITING)
        changes = failure_changes(TaskStatus.TIMEOUT, None, error, now)
        batch_id = claim.task.batch_id
        changed = self._ending(
            lambda: self._end(match, changes, claim.task_id, TaskStatus.TIMEOUT, batch_id)
        )
        if not changed:
            return None
        task = dataclasses.replace(
            claim.task,
            status=TaskStatus.TIMEOUT,
            last_error=error,
            finished_at=now,
            handler_running=False,
        )
        return Transition(task=task, previous=claim.task.status)

    def handler_returned(self, claims: Sequence[Claim]) -> int:
        """Each claim's handler returned after its task ended without it (a TIMEOUT while it
        ran): the lease it still holds under the claim's token is let go, and the task has
        ended now (its dependents and batch settled: ``_handler_ended``). Claims of tasks
        that did not end so change nothing."""
        return sum(
            self._handler_ended(Q(pk=claim.task_id, lease_token=claim.token)) for claim in claims
        )

    def release(self, claims: Sequence[Claim]) -> int:
        released = self._release(claims)
        if released:
            self._work_committed([claim.task.queue for claim in claims])
        return released

    def _release(self, claims: Sequence[Claim]) -> int:
        released = 0
        for chunk in chunks(list(claims), 100):
            released += (
                self._tasks()
                .filter(claims_match(chunk), available=False, status__in=WAITING)
                .update(
                    available=True,
                    worker_id=None,
                    lease_expires_at=None,
                    lease_token=F("lease_token") + 1,  # the old holder can no longer start it
                )
            )
        return released

    def cancel(self, task_id: str) -> CancelResult:
        now = self.clock.now()
        changes: dict[str, object] = {
            "status": TaskStatus.CANCELLED.value,
            "available": False,
            "finished_at": now,
            "lease_expires_at": None,
            # A claim taken before can no longer start it (worker_id stays: who held it).
            "lease_token": F("lease_token") + 1,
            "deadline_at": None,
            "waiting_for": None,
        }
        match = Q(pk=task_id, status__in=WAITING)

        def end() -> TaskInfo | None:
            if not self._tasks().filter(match).update(**changes):
                return None
            task = self.get(task_id)  # its batch counts it (a member) in this transaction
            assert task is not None
            self._settle_endings([(task.batch_id, task_id, TaskStatus.CANCELLED.value)])
            return task

        task = self._ending(end)
        if task is not None:
            return CancelResult(changed=True, task=task)
        requested = (
            self._tasks()
            .filter(pk=task_id, status=TaskStatus.RUNNING.value)
            .update(cancel_requested=True)
        )
        if requested:
            return CancelResult(changed=True, task=self.get(task_id), requested_only=True)
        return CancelResult(changed=False, task=self.get(task_id))

    def _retry_from(
        self, row: ReliableTask, depends_on: list[str], from_step: str
    ) -> Transition | None:
        """retry() discarding the checkpoints from step ``from_step`` on, in the open
        transaction; UnknownStepError, before anything is written, when it has none."""
        first = first_discarded(self.alias, row.task_id, from_step)
        retried = retry_row(self, row, depends_on)  # its batch counted in this transaction too
        if retried is not None:
            discard_steps(self.alias, row.task_id, first)
        return retried

    def retry_plain(self, task_ids: Sequence[str]) -> tuple[list[Transition], list[str]]:
        return self._ending(lambda: retry_plain_rows(self, task_ids))

    def retry(self, task_id: str, from_step: str | None = None) -> Transition | None:
        row = self._tasks().filter(pk=task_id).first()
        if row is None or TaskStatus(row.status) not in RETRYABLE_BY_HAND:
            return None
        depends_on = json_ids(row.depends_on)
        if from_step is not None:
            # The steps read, the task reset and its checkpoints deleted in one transaction:
            # a retry refused (its status changed meanwhile, a lease still held) deletes none.
            return self._ending(lambda: self._retry_from(row, depends_on, from_step))
        if depends_on:
            # A dependent reads its dependencies and waits again in one transaction, so an
            # ending of one either came before (read here) or settles it after.
            return self._ending(lambda: retry_row(self, row, depends_on))
        with self._counted([row.batch_id]):
            return retry_row(self, row, [])
