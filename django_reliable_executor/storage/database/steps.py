"""Durable steps on the database storage: a checkpoint is a row of reliable_executor_task_step,
written in the transaction of the conditional UPDATE that renews the claim's lease."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction

from ...core.records import Claim
from ...core.serialization import Encoded
from ...core.states import TaskStatus
from .access import DatabaseAccess
from .step_rows import step_rows


class Steps(DatabaseAccess):
    """record_step and step_results (step_rows.py holds what the other parts read and delete)."""

    def record_step(self, claim: Claim, name: str, result: Encoded, lease_seconds: float) -> bool:
        """One transaction (or a savepoint of the caller's: ``atomic=True``): the fenced
        UPDATE renewing the lease, which locks the task's row, then the row of the step,
        deleted and inserted anew (last in the finishing order). The row lock keeps every
        other write of the task (a recovery, a claim, a retry) out until the checkpoint
        commits or rolls back, so a checkpoint that commits was written while the claim held
        the task."""
        now = self.clock.now()

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
