"""The rows of reliable_executor_task_step (durable steps) that the other parts read or delete:
a task's read fills ``TaskInfo.steps``, a manual retry ``from_step`` and the purge delete them.
The writes of a checkpoint are steps.py's."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from django.db import connections
from django.db.models import QuerySet

from ...core.records import StepInfo
from ...exceptions import UnknownStepError
from ...models import (
    ReliableTaskEvent,
    ReliableTaskParameter,
    ReliableTaskStep,
    ReliableTaskTag,
)
from .rows import CHUNK, chunks


def step_rows(alias: str) -> QuerySet[ReliableTaskStep]:
    return ReliableTaskStep.objects.using(alias)


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)


def steps_of(alias: str, task_ids: Sequence[str]) -> dict[str, tuple[StepInfo, ...]]:
    """The stored steps of these tasks, each in finishing order (tasks without any left out):
    one query per chunk of ids."""
    found: dict[str, list[StepInfo]] = {}
    for chunk in chunks(list(dict.fromkeys(task_ids))):
        rows = (
            step_rows(alias)
            .filter(task_id__in=chunk)
            .order_by("task_id", "id")
            .values_list("task_id", "name", "finished_at")
        )
        for task_id, name, finished_at in rows:
            found.setdefault(task_id, []).append(StepInfo(name, _aware(finished_at)))
    return {task_id: tuple(steps) for task_id, steps in found.items()}


def first_discarded(alias: str, task_id: str, from_step: str) -> int:
    """The row id of step ``from_step`` of the task: it and every later one (a larger id:
    finished after it) go with a retry from that step. UnknownStepError when it has none."""
    rows = step_rows(alias).filter(task_id=task_id)
    found = rows.filter(name=from_step).values_list("id", flat=True).first()
    if found is None:
        known = list(rows.order_by("id").values_list("name", flat=True))
        raise UnknownStepError(task_id, from_step, known)
    return found


def discard_steps(alias: str, task_id: str, from_id: int) -> int:
    """Delete the task's checkpoints from row ``from_id`` on (the caller's transaction)."""
    deleted, _ = step_rows(alias).filter(task_id=task_id, id__gte=from_id).delete()
    return deleted


def purge_steps(alias: str, task_ids: Sequence[str], tasks_table: str) -> None:
    """Delete the checkpoints, the events sent (durable waits) and the index rows of the tags
    and parameters of those of ``task_ids`` whose task row is gone (just purged; a task the
    purge's DELETE skipped keeps its own)."""
    quote = connections[alias].ops.quote_name
    for model in (ReliableTaskStep, ReliableTaskEvent, ReliableTaskTag, ReliableTaskParameter):
        table = quote(model._meta.db_table)
        for chunk in chunks(list(task_ids), CHUNK // 2):  # each id is two parameters here
            marks = ", ".join(["%s"] * len(chunk))
            with connections[alias].cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {table} WHERE task_id IN ({marks}) AND task_id NOT IN "
                    f"(SELECT task_id FROM {tasks_table} WHERE task_id IN ({marks}))",
                    [*chunk, *chunk],
                )
