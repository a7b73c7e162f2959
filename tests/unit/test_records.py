"""records.copy_with: the worker's cheap dataclasses.replace for the frozen records."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from django_reliable_executor.core.records import Claim, TaskInfo, copy_with
from django_reliable_executor.core.states import TaskStatus

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)


def _task() -> TaskInfo:
    return TaskInfo(
        task_id="t1", task_name="demo.noop", status=TaskStatus.CREATED, queue="default",
        priority=0, parameter={"a": 1}, attempts=0, retry_limit=3, retry_interval=1000,
        retry_backoff="fixed", max_duration_millis=None, created_at=NOW, run_at=NOW,
        started_at=None, finished_at=None, last_error=None, result=None, worker_id="w",
        cancel_requested=False,
    )  # fmt: skip


def test_copy_with_equals_dataclasses_replace_and_leaves_the_original_alone():
    task = _task()
    changes = {"status": TaskStatus.RUNNING, "attempts": 1, "started_at": NOW}
    copy = copy_with(task, **changes)
    assert copy == dataclasses.replace(task, **changes)
    assert type(copy) is TaskInfo and copy is not task
    assert (task.status, task.attempts, task.started_at) == (TaskStatus.CREATED, 0, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        copy.attempts = 2  # type: ignore[misc]


def test_a_started_claim_counts_the_attempt_on_the_task_and_the_budget():
    claim = Claim(task=_task(), token=4, budget_attempts=1, deadline_at=None)
    started = claim.started(NOW)
    assert (started.task.status, started.task.attempts, started.task.started_at) == (
        TaskStatus.RUNNING, 1, NOW,
    )  # fmt: skip
    assert (started.token, started.budget_attempts) == (4, 2)
    assert claim.task.status is TaskStatus.CREATED


def test_copy_with_refuses_a_name_that_is_no_field():
    with pytest.raises(AssertionError, match="not fields"):
        copy_with(_task(), statuss=TaskStatus.RUNNING)
