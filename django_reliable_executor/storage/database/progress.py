"""Handlers' progress reports on the database storage: one UPDATE for a batch."""

from __future__ import annotations

from collections.abc import Sequence

from ...core.progress import Progress, progress_to_json
from ...core.records import Claim
from ...core.serialization import dumps
from ...core.states import TaskStatus
from .access import DatabaseAccess
from .rows import chunks, claimed_by_holders


class ProgressReports(DatabaseAccess):
    """record_progress: the ``progress`` column, fenced by the claim's worker and token."""

    def record_progress(self, reports: Sequence[tuple[Claim, Progress]]) -> int:
        # Written as JSON text; PostgreSQL casts it to jsonb.
        value_sql = "CAST(%s AS jsonb)" if self.vendor == "postgresql" else "%s"
        stored = 0
        for chunk in chunks(list(reports), 100):
            claims = [claim for claim, _ in chunk]
            cases = "CASE task_id " + f"WHEN %s THEN {value_sql} " * len(chunk) + "END"
            params: list[object] = []
            for claim, progress in chunk:
                params += [claim.task_id, dumps(progress_to_json(progress))]
            held_sql, held_params = claimed_by_holders(claims)
            stored += self._execute(
                f"UPDATE {self._table} SET progress = {cases} WHERE status = %s AND ({held_sql})",
                [*params, TaskStatus.RUNNING.value, *held_params],
            )
        return stored
