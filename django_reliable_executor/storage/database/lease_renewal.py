"""PostgreSQL's heartbeat write: renews a worker's leases without ever waiting for more than one
row lock at a time, so it cannot take part in a deadlock."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .rows import holding_sql


def renew_skipping_locked(
    cursor: Any, table: str, worker_id: str, chunk: Sequence[tuple[str, int]], until: Any
) -> None:
    """Renew to ``until`` the leases ``worker_id`` holds under the chunk's tokens, skipping the
    rows another transaction holds (this worker's start or completion, a cancel): waiting for
    several locks, in whatever order the plan met them, could deadlock against that write.
    The rows skipped are then renewed one statement each, which holds no other lock while it
    waits: no cycle."""
    sql, params = holding_sql(worker_id, chunk)
    cursor.execute(
        f"WITH locked AS MATERIALIZED (SELECT task_id AS locked_id FROM {table} "
        f"WHERE {sql} FOR NO KEY UPDATE SKIP LOCKED) UPDATE {table} "
        "SET lease_expires_at = %s FROM locked WHERE task_id = locked_id RETURNING task_id",
        [*params, until],
    )
    renewed = {task_id for (task_id,) in cursor.fetchall()}
    for task_id, token in chunk:
        if task_id not in renewed:  # skipped, or not held (then this changes nothing)
            one_sql, one_params = holding_sql(worker_id, [(task_id, token)])
            cursor.execute(
                f"UPDATE {table} SET lease_expires_at = %s WHERE {one_sql}", [until, *one_params]
            )
