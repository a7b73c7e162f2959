"""Durable steps on the database storage: a checkpoint is a row of reliable_executor_task_step,
written only while the claim holds the task, with the conditional UPDATE that renews the
claim's lease: one statement on PostgreSQL; elsewhere one, or two when the lease is due a
renewal."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import connections, transaction

from ...core.records import Claim
from ...core.serialization import Encoded
from ...core.states import TaskStatus
from ...models import ReliableTaskStep
from .access import DatabaseAccess
from .step_rows import step_rows


class Steps(DatabaseAccess):
    """record_step and step_results (step_rows.py holds what the other parts read and delete)."""

    def record_step(
        self,
        claim: Claim,
        name: str,
        result: Encoded,
        lease_seconds: float,
        renew_lease: bool = True,
    ) -> bool:
        """The checkpoint's row inserted only while the claim holds the task, and the lease
        renewed: on PostgreSQL one statement (the fenced UPDATE of the lease, whose row lock
        stays until the commit, feeding the INSERT), whatever ``renew_lease`` says;
        elsewhere the fenced UPDATE when ``renew_lease``, then an INSERT ... SELECT that
        reads the task's row with a locking read and inserts only while the claim still
        holds it (no transaction of its own: each statement is fenced, and a refusal stores
        nothing). A checkpoint of that name stored already (which no attempt's own flow
        writes twice) takes the path that replaces it: ``_replace``. Inside the caller's
        transaction (``atomic=True``) the statements join it."""
        now = self.clock.now()
        lease_until = self._dt(now + dt.timedelta(seconds=lease_seconds))
        fence = [claim.task_id, TaskStatus.RUNNING.value, claim.task.worker_id, claim.token]
        row = [name, result.text, self._dt(now), claim.token]
        tasks, steps = self._table, self._steps_table
        held = "task_id = %s AND status = %s AND worker_id = %s AND lease_token = %s"
        columns = "(task_id, name, result, finished_at, token)"
        if self.vendor == "postgresql":
            stored = self._execute(
                f"WITH held AS (UPDATE {tasks} SET lease_expires_at = %s WHERE {held} "
                f"RETURNING task_id) INSERT INTO {steps} {columns} "
                "SELECT task_id, %s, %s::jsonb, %s, %s FROM held "
                "ON CONFLICT (task_id, name) DO UPDATE SET result = EXCLUDED.result, "
                "finished_at = EXCLUDED.finished_at, token = EXCLUDED.token, id = DEFAULT",
                [lease_until, *fence, *row],
            )
            return bool(stored)
        if renew_lease and not self._execute(
            f"UPDATE {tasks} SET lease_expires_at = %s WHERE {held}", [lease_until, *fence]
        ):
            return False
        insert, lock, skip = (
            ("INSERT IGNORE INTO", " FOR UPDATE", "")
            if self.vendor == "mysql"
            else ("INSERT INTO", "", " ON CONFLICT (task_id, name) DO NOTHING")
        )
        stored = self._execute(
            f"{insert} {steps} {columns} SELECT %s, %s, %s, %s, %s FROM {tasks} "
            f"WHERE {held}{lock}{skip}",
            [claim.task_id, *row, *fence],
        )
        return bool(stored) or self._replace(claim, name, result, lease_seconds, now)

    @property
    def _steps_table(self) -> str:
        return connections[self.alias].ops.quote_name(ReliableTaskStep._meta.db_table)

    def _replace(
        self, claim: Claim, name: str, result: Encoded, lease_seconds: float, now: dt.datetime
    ) -> bool:
        """The checkpoint written where one of its name may be stored (or the claim may no
        longer hold the task): one transaction (or a savepoint of the caller's), the fenced
        UPDATE renewing the lease, which locks the task's row, then the step's row deleted and
        inserted anew (last in the finishing order). False when the claim is not held."""

        def write() -> bool:
            with transaction.atomic(using=self.alias):
                held = (
                    self._tasks()
                    .filter(
                        pk=claim.task_id,
                        status=TaskStatus.RUNNING.value,
                        worker_id=claim.task.worker_id,
                        lease_token=claim.token,
                    )
                    .update(lease_expires_at=now + dt.timedelta(seconds=lease_seconds))
                )
                if not held:
                    return False
                rows = step_rows(self.alias)
                rows.filter(task_id=claim.task_id, name=name).delete()
                rows.create(
                    task_id=claim.task_id,
                    name=name,
                    result=result.value,
                    finished_at=now,
                    token=claim.token,
                )
                return True

        if transaction.get_connection(self.alias).in_atomic_block:
            return write()  # a deadlock victim's whole transaction is the caller's to run again
        return self._retrying(write)

    def step_results(self, task_id: str) -> dict[str, Any]:
        rows = step_rows(self.alias).filter(task_id=task_id).order_by("id")
        return dict(rows.values_list("name", "result"))
