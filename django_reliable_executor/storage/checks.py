"""The arguments of the storage interface, checked and shaped once before a backend's part runs."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from ..core.clock import Clock
from ..core.minute_counts import MinuteCounts, epoch_minute, minute_start
from ..core.parameter_filter import Pairs
from ..core.queries import ClaimRequest, TaskQuery
from ..core.rate_limits import RateLimit
from ..core.states import TERMINAL_STATUSES, TaskStatus


def claim_request(
    worker_id: str,
    queues: Sequence[str],
    limit: int,
    lease_seconds: float,
    name_limits: Mapping[str, int] | None,
    start: int,
    rate_limits: Mapping[str, RateLimit] | None,
    key_limits: Mapping[str, int] | None = None,
    fair_limit: int | None = None,
) -> ClaimRequest | None:
    """What ``TaskStorage.claim`` asks its backend's ``_claim``; None when it can take
    nothing (no queue, or a limit below 1)."""
    if limit <= 0 or not queues:
        return None
    return ClaimRequest(
        worker_id,
        tuple(queues),
        limit,
        lease_seconds,
        dict(name_limits or {}),
        max(start, 0),
        dict(rate_limits or {}),
        dict(key_limits or {}),
        None if fair_limit is None else max(fair_limit, 0),
    )


def task_query(
    status: TaskStatus | None,
    statuses: Collection[TaskStatus] | None,
    task_name: str | None,
    queue: str | None,
    limit: int,
    offset: int,
    batch_id: str | None,
    schedule_runs: bool | None,
    schedule_id: str | None,
    tag: str | None = None,
    parameter: Pairs | None = None,
    indexed: tuple[tuple[str, str], ...] = (),
) -> TaskQuery | None:
    """The page ``TaskStorage.list`` asks its backend's ``_list``; None when it holds no
    task (a limit below 1, or no status wanted)."""
    wanted = wanted_statuses(status, statuses)
    if limit <= 0 or wanted == frozenset():
        return None
    return TaskQuery(
        wanted,
        task_name,
        queue,
        limit,
        offset,
        batch_id,
        schedule_runs,
        schedule_id,
        tag,
        parameter,
        indexed,
    )


def wanted_statuses(
    status: TaskStatus | None, statuses: Collection[TaskStatus] | None
) -> frozenset[TaskStatus] | None:
    """The statuses ``list`` keeps from its ``status``/``statuses`` arguments (None: any)."""
    if status is not None and statuses is not None:
        raise ValueError("list by status or by statuses, not both")
    if statuses is not None:
        return frozenset(TaskStatus(s) for s in statuses)
    return frozenset({TaskStatus(status)}) if status is not None else None


def purged_statuses(statuses: frozenset[TaskStatus] | None) -> frozenset[TaskStatus]:
    """The terminal statuses ``purge_finished`` deletes (of ``statuses``; None: all)."""
    return TERMINAL_STATUSES if statuses is None else frozenset(statuses) & TERMINAL_STATUSES


def minute_span(clock: Clock, minutes: int) -> tuple[int, int]:
    """The epoch minutes (first, last) of ``throughput``'s last ``minutes`` minutes."""
    if minutes <= 0:
        raise ValueError("minutes must be positive")
    last = epoch_minute(clock.now())
    return last - minutes + 1, last


def every_minute(counted: Mapping[int, MinuteCounts], first: int, last: int) -> list[MinuteCounts]:
    """``counted`` for each minute of ``first..last``, the minutes with no ending as zeros."""
    return [
        counted.get(minute) or MinuteCounts(minute=minute_start(minute))
        for minute in range(first, last + 1)
    ]
