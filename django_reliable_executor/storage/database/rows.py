"""Rows to records and back, and the SQL fragments the database storage shares."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from django.db.models import Q
from django.utils.dateparse import parse_datetime

from ...core.progress import progress_from_json
from ...core.records import Claim, TaskInfo
from ...core.states import LIVE_STATUSES, TERMINAL_STATUSES, WAITING_STATUSES, TaskStatus
from ...models import ReliableTask

T = TypeVar("T")
# The status sets of states.py as the stored values a query takes.
WAITING = sorted(s.value for s in WAITING_STATUSES)
LIVE = sorted(s.value for s in LIVE_STATUSES)
TERMINAL = sorted(s.value for s in TERMINAL_STATUSES)
NOT_WAITING = sorted(s.value for s in TaskStatus if s not in WAITING_STATUSES)
# MySQL error codes worth retrying: deadlock found, lock wait timeout.
MYSQL_RETRYABLE = {1213, 1205}
# PostgreSQL SQLSTATEs worth retrying: deadlock detected, serialization failure.
POSTGRES_RETRYABLE = {"40P01", "40001"}
CHUNK = 500  # ids per IN (...) list: well under every backend's parameter limit
# Rows per OR of (task_id, condition) pairs (keyed): SQLite refuses an expression tree 1000
# deep, which an OR of about 1000 terms is.
OR_CHUNK = 200


def lock_conflict(exc: BaseException, vendor: str) -> bool:
    """Was ``exc`` a transaction chosen as a deadlock victim (or one whose lock wait timed
    out): rolled back whole by the server, and worth running again as it was?"""
    if vendor == "mysql":
        return bool(exc.args) and exc.args[0] in MYSQL_RETRYABLE
    if vendor == "postgresql":  # psycopg's error, wrapped by Django's
        return getattr(exc.__cause__, "sqlstate", None) in POSTGRES_RETRYABLE
    return False


def to_info(row: ReliableTask) -> TaskInfo:
    return TaskInfo(
        task_id=row.task_id,
        task_name=row.task_name,
        status=TaskStatus(row.status),
        queue=row.queue,
        priority=row.priority,
        parameter=row.parameter,
        attempts=row.attempts,
        retry_limit=row.retry_limit,
        retry_interval=row.retry_interval,
        retry_backoff=row.retry_backoff,
        max_duration_millis=row.max_duration_millis,
        created_at=row.created_at,
        run_at=row.run_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_error=row.last_error,
        result=row.result,
        worker_id=row.worker_id,
        cancel_requested=row.cancel_requested,
        progress=progress_from_json(row.progress),
        depends_on=tuple(row.depends_on or ()),
        waiting_for=tuple(row.waiting_for or ()),
        trace_context=row.trace_context,
        batch_id=row.batch_id,
        handler_running=handler_running(row.status, row.lease_expires_at),
        attempt_timeout=row.attempt_timeout,
        waiting=row.waiting if row.status == TaskStatus.PENDING.value else None,
        resumptions=row.resumptions,
        concurrency_key=row.concurrency_key,
        rate_key=row.rate_key,
        tags=tuple(row.tags or ()),
    )


def handler_running(status: str, lease_expires_at: dt.datetime | None) -> bool:
    """RUNNING, or terminal while its holder keeps the lease: a handler that runs on past
    its attempt (see Chores.expire_overdue), until its worker reports it returned
    (Transitions.handler_returned) or the master recovers the lapsed lease."""
    if status == TaskStatus.RUNNING.value:
        return True
    return lease_expires_at is not None and status in TERMINAL


def claim_of(row: ReliableTask) -> Claim:
    """The claim a model row stands for under its current fencing token."""
    return Claim(
        task=to_info(row),
        token=row.lease_token,
        budget_attempts=row.budget_attempts,
        deadline_at=row.deadline_at,
        has_dependents=row.has_dependents,
    )


def claims_match(claims: Sequence[Claim]) -> Q:
    """Rows still held under these claims' fencing tokens."""
    match = Q()
    for claim in claims:
        match |= Q(pk=claim.task_id, lease_token=claim.token)
    return match


def keyed(rows: Sequence[Sequence[Any]], condition: str) -> tuple[str, list[Any]]:
    """SQL for "the row of each ``(task_id, *values)`` in ``rows`` meets ``condition``", whose
    placeholders take the values.

    Every condition sits beside its row's primary key, never alone in the WHERE clause: a
    lone ``available = %s`` made SQLite's planner walk the claim index over every finished
    task (their available is false too) instead of looking the few rows up by key. The
    leading primary-key IN list steers every planner to the primary key likewise: left to
    itself, PostgreSQL sometimes chose the claim index and scanned every claimed row."""
    marks = ", ".join(["%s"] * len(rows))
    each = " OR ".join([f"(task_id = %s AND {condition})"] * len(rows))
    params: list[Any] = [row[0] for row in rows]
    for row in rows:
        params += row
    return f"task_id IN ({marks}) AND ({each})", params


def held_by_claims(claims: Sequence[Claim]) -> tuple[str, list[Any]]:
    """SQL for "rows still held under these claims' fencing tokens"."""
    return keyed([(claim.task_id, claim.token) for claim in claims], "lease_token = %s")


# A lease held by this worker under this token, and still claimed.
HOLDER_SQL = "lease_token = %s AND worker_id = %s AND available = %s"


def claimed_by_holders(claims: Sequence[Claim]) -> tuple[str, list[Any]]:
    """SQL for "rows still claimed (not available) by each claim's worker under its fencing
    token": what a start must find. The token alone is not enough where a manual transition
    ran in between (cancel, retry), so the holder is checked too."""
    rows = [(claim.task_id, claim.token, claim.task.worker_id, False) for claim in claims]
    return keyed(rows, HOLDER_SQL)


def holding_sql(worker_id: str, tokens: Sequence[tuple[str, int]]) -> tuple[str, list[Any]]:
    """SQL for "leases ``worker_id`` holds under these tokens": claimed or running tasks, and
    tasks that timed out while running whose holder keeps its lease (lease_expires_at set)."""
    sql, params = keyed(
        [(task_id, token, worker_id, False) for task_id, token in tokens], HOLDER_SQL
    )
    sql += (
        f" AND (status IN ({', '.join(['%s'] * len(LIVE))}) "
        "OR (status = %s AND lease_expires_at IS NOT NULL))"
    )
    return sql, [*params, *LIVE, TaskStatus.TIMEOUT.value]


# A claim does not read the task's progress: a worker has no use for it (None in its TaskInfo).
# Nor its dependencies (a claimed task waits for none; context.dependency_results reads them).
# It reads the batch_id: a member's ending write counts it in its batch (batches.py). Its
# durable steps are another table's (context.step reads them at the attempt's first step).
NOT_CLAIMED = (
    "progress",
    "depends_on",
    "waiting_for",
    "handler_running",
    "steps",
    "waiting",
    "debounced",  # a submit's answer only
)
INFO_FIELDS = [f.name for f in dataclasses.fields(TaskInfo) if f.name not in NOT_CLAIMED]
CLAIM_FIELDS = [*INFO_FIELDS, "lease_token", "budget_attempts", "deadline_at", "has_dependents"]
CLAIM_COLUMNS_SQL = ", ".join(CLAIM_FIELDS)  # the model's column names are its field names
# The statuses of a held task (with available false: claimed and not finished; a dependent
# waiting for its dependencies is unavailable too, but held by no one). Written into the SQL
# as literals so that PostgreSQL matches the partial index of migration 0006.
HELD_SQL = "NOT available AND status IN ({}) AND waiting_for IS NULL".format(
    ", ".join(f"'{s}'" for s in LIVE)
)
# A claimed task's rate key as its rate log stores it ("" for none).
RATE_KEY_SQL = "COALESCE(rate_key, '') AS log_key"
DATETIME_FIELDS = ["created_at", "run_at", "started_at", "finished_at", "deadline_at"]


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def spans(sizes: Sequence[int], max_bytes: int, max_rows: int = CHUNK) -> Iterator[slice]:
    """Consecutive runs of items, each of at most ``max_rows`` items and ``max_bytes`` bytes
    together (an item larger than that alone makes a run of its own)."""
    if sum(sizes) <= max_bytes:  # the common case: only the row count splits
        for start in range(0, len(sizes), max_rows):
            yield slice(start, min(start + max_rows, len(sizes)))
        return
    start = total = 0
    for index, size in enumerate(sizes):
        if index > start and (index - start >= max_rows or total + size > max_bytes):
            yield slice(start, index)
            start, total = index, 0
        total += size
    if start < len(sizes):
        yield slice(start, len(sizes))


def claim_from_row(row: Sequence[Any], **extra: Any) -> Claim:
    """A claim from raw column values, converted the way each driver needs; ``extra``: more
    fields of the claim (a rate-limited claim's limit and logged time)."""
    values = dict(zip(CLAIM_FIELDS, row, strict=True))
    for key in ("parameter", "result", "trace_context"):
        # Every driver hands JSON back as text here (Django sets psycopg up that way too).
        if isinstance(values[key], str):
            values[key] = json.loads(values[key])
    values["cancel_requested"] = bool(values["cancel_requested"])  # 0/1 on MySQL, SQLite
    tags = values["tags"]
    values["tags"] = tuple(json.loads(tags) if isinstance(tags, str) else tags or ())
    for key in DATETIME_FIELDS:
        value = values[key]
        if isinstance(value, str):
            value = parse_datetime(value)
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)  # stored as naive UTC
        values[key] = value
    token = values.pop("lease_token")
    budget_attempts = values.pop("budget_attempts")
    deadline_at = values.pop("deadline_at")
    has_dependents = bool(values.pop("has_dependents"))  # 0/1 on MySQL, SQLite
    values["status"] = TaskStatus(values["status"])
    values["handler_running"] = values["status"] is TaskStatus.RUNNING
    return Claim(
        task=TaskInfo(**values),
        token=token,
        budget_attempts=budget_attempts,
        deadline_at=deadline_at,
        has_dependents=has_dependents,
        **extra,
    )


def failure_changes(
    status: TaskStatus, run_at: dt.datetime | None, error: str, now: dt.datetime
) -> dict[str, Any]:
    if status is TaskStatus.PENDING:
        assert run_at is not None
        return {
            "status": status.value,
            "available": True,
            "run_at": run_at,
            "last_error": error,
            "lease_expires_at": None,
            "waiting": None,  # a retry, not a durable wait (waits.py)
            "waiting_for": None,
        }
    return {
        "status": status.value,
        "available": False,
        "last_error": error,
        "finished_at": now,
        "lease_expires_at": None,
        "deadline_at": None,
    }


@dataclasses.dataclass(frozen=True)
class Pick:
    """One claiming statement's choice: up to ``limit`` due tasks of ``queues`` for
    ``worker_id`` under a lease until ``lease_until``, leaving out the ``excluded`` task
    names, or only those of ``name`` (and of ``ids``, where given)."""

    worker_id: str
    queues: tuple[str, ...]
    limit: int
    now: dt.datetime
    lease_until: dt.datetime
    excluded: tuple[str, ...] = ()
    name: str | None = None
    ids: tuple[str, ...] = ()  # only these tasks (rate_limit's choice)
