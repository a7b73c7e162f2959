"""What crosses the process pool's pipe: a TaskInfo as JSON and back, and how a child ended."""

from __future__ import annotations

import datetime as dt
import json

from django_reliable_executor.core.progress import make_progress
from django_reliable_executor.core.records import StepInfo, TaskInfo
from django_reliable_executor.core.serialization import dumps
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.core.task_json import task_from_json, task_to_json
from django_reliable_executor.worker.children import describe_exit

NOW = dt.datetime(2026, 12, 1, 12, 30, 15, 123456, tzinfo=dt.timezone.utc)


def test_a_task_survives_json_both_ways():
    task = TaskInfo(
        task_id="t1", task_name="demo.echo", status=TaskStatus.RUNNING, queue="default",
        priority=3, parameter={"a": [1, 2.5, None, "é"]}, attempts=2, retry_limit=3,
        retry_interval=1000, retry_backoff="exponential", max_duration_millis=60000,
        created_at=NOW, run_at=NOW, started_at=NOW + dt.timedelta(seconds=1), finished_at=None,
        last_error="Traceback ...", result=None, worker_id="w1", cancel_requested=False,
    )  # fmt: skip
    text = dumps(task_to_json(task))  # as the worker sends it: JSON text, never pickle
    assert task_from_json(json.loads(text)) == task


def test_a_task_with_progress_survives_json_both_ways():
    task = TaskInfo(
        task_id="t1", task_name="demo.echo", status=TaskStatus.RUNNING, queue="default",
        priority=0, parameter=None, attempts=1, retry_limit=3, retry_interval=1000,
        retry_backoff="fixed", max_duration_millis=None, created_at=NOW, run_at=NOW,
        started_at=NOW, finished_at=None, last_error=None, result=None, worker_id="w1",
        cancel_requested=False, progress=make_progress(2.5, 4, "half", NOW),
    )  # fmt: skip
    plain = json.loads(dumps(task_to_json(task)))
    assert plain["progress"] == {
        "current": 2.5,
        "total": 4,
        "message": "half",
        "updated_at": NOW.isoformat(),
    }
    assert task_from_json(plain) == task


def test_a_task_with_steps_survives_json_both_ways():
    task = TaskInfo(
        task_id="t1", task_name="demo.steps", status=TaskStatus.FAILED, queue="default",
        priority=0, parameter=None, attempts=1, retry_limit=0, retry_interval=1000,
        retry_backoff="fixed", max_duration_millis=None, created_at=NOW, run_at=NOW,
        started_at=NOW, finished_at=NOW, last_error="x", result=None, worker_id="w1",
        cancel_requested=False,
        steps=(StepInfo("one", NOW), StepInfo("two", NOW + dt.timedelta(seconds=1))),
    )  # fmt: skip
    plain = json.loads(dumps(task_to_json(task)))
    assert plain["steps"] == [
        {"name": "one", "finished_at": NOW.isoformat()},
        {"name": "two", "finished_at": (NOW + dt.timedelta(seconds=1)).isoformat()},
    ]
    assert task_from_json(plain) == task


def test_how_a_child_ended_is_said_plainly():
    assert describe_exit(-11) == "killed by signal SIGSEGV (exit code -11)"
    assert describe_exit(-9) == "killed by signal SIGKILL (exit code -9)"
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(None) == "exit status unknown"
