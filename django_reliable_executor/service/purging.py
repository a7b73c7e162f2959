"""Purging finished tasks and batches in paced rounds (``executor.purge_finished`` and
``executor.purge_batches``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..core.numbers import is_int, is_number
from ..core.states import TERMINAL_STATUSES, TaskStatus


def finished_statuses(
    statuses: Iterable[TaskStatus | str] | None,
) -> frozenset[TaskStatus] | None:
    """The statuses a purge may delete: finished ones only (None: every finished one)."""
    chosen = frozenset(TaskStatus(s) for s in statuses) if statuses is not None else None
    if chosen is not None and not chosen <= TERMINAL_STATUSES:
        live = ", ".join(sorted(s.value for s in chosen - TERMINAL_STATUSES))
        raise ValueError(f"only finished tasks can be purged, not {live}")
    return chosen


def in_rounds(
    purge_round: Callable[[], int],
    batch: int,
    pause_seconds: float,
    sleep: Callable[[float], object],
    progress: Callable[[int], None] | None = None,
) -> int:
    """Run ``purge_round`` (deleting up to ``batch``) until a round deletes fewer, pausing
    ``pause_seconds`` between two; the total deleted."""
    if not is_int(batch) or batch < 1:
        raise ValueError("batch must be an integer >= 1")
    if not is_number(pause_seconds) or not 0 <= pause_seconds <= 3600:
        raise ValueError(
            f"pause_seconds must be a number of seconds from 0 to 3600, not {pause_seconds!r}"
        )
    deleted = 0
    while True:
        done = purge_round()
        deleted += done
        if progress is not None:
            progress(deleted)
        if done < batch:
            return deleted
        if pause_seconds:
            sleep(pause_seconds)
