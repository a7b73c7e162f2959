"""Contract: list_tasks tells schedule runs from submitted tasks on every backend
(``schedule_runs=``, ``schedule_id=``), by the form of a run's id; the admin's task list
filters on it (``?origin=``, ``?schedule=``)."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.master.schedule_firing import ScheduleFiring

# Submitted ids that look like runs but are not (is_fire_task_id says so): never a run.
LOOKALIKES = ("a@b", "nightly@20261129T030000.000000Z", "x@2026112T030000Z", "nightly@")


def fire_runs(executor, clock, schedule_id: str, runs: int) -> None:
    executor.schedule(schedule_id, "demo.echo", {"s": schedule_id}, every=60)
    for _ in range(runs):
        clock.advance(60)
        ScheduleFiring(executor).run_once()


def ids(tasks) -> set[str]:
    return {task.task_id for task in tasks}


def test_schedule_runs_are_listed_apart_from_submitted_tasks(executor, clock):
    submitted = {executor.submit("demo.echo", None, task_id=i).task_id for i in LOOKALIKES}
    submitted.add(executor.submit("demo.noop", None).task_id)
    fire_runs(executor, clock, "nightly", 2)
    fire_runs(executor, clock, "nightly@eu", 1)  # a schedule id may hold "@" (nightly fires too)
    every = ids(executor.list_tasks(limit=1000))
    runs = every - submitted
    assert len(runs) == 4
    assert ids(executor.list_tasks(schedule_runs=False)) == submitted
    assert ids(executor.list_tasks(schedule_runs=True)) == runs
    nightly = ids(executor.list_tasks(schedule_id="nightly"))
    eu = ids(executor.list_tasks(schedule_id="nightly@eu"))
    assert len(nightly) == 3 and len(eu) == 1 and nightly | eu == runs
    assert executor.list_tasks(schedule_id="night") == []
    # With the other filters, and a page at a time.
    assert ids(executor.list_tasks(schedule_runs=False, task_name="demo.noop")) == (
        submitted - set(LOOKALIKES)
    )
    assert executor.list_tasks(schedule_runs=True, task_name="demo.noop") == []
    pages = [executor.list_tasks(schedule_id="nightly", limit=1, offset=n) for n in range(4)]
    assert [len(page) for page in pages] == [1, 1, 1, 0]
    assert set().union(*map(ids, pages)) == nightly
    waiting = executor.list_tasks(schedule_runs=True, status=TaskStatus.CREATED)
    assert ids(waiting) <= runs


def test_finished_runs_are_told_apart_too(executor, storage, clock):
    """Finished tasks are listed from other indexes on Redis: the filter holds there too."""
    from tests.support.contract_support import LEASE

    executor.submit("demo.echo", None, task_id="a@b")
    fire_runs(executor, clock, "hourly", 1)
    for claim in storage.claim("w1", ["default"], 10, LEASE):
        started = storage.start(claim, LEASE)
        assert started is not None
        storage.complete(started, "ok")
    done = executor.list_tasks(status=TaskStatus.COMPLETED, schedule_runs=True)
    assert [task.task_id.startswith("hourly@") for task in done] == [True]
    done = executor.list_tasks(status=TaskStatus.COMPLETED, schedule_runs=False)
    assert [task.task_id for task in done] == ["a@b"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"schedule_runs": "no"}, "schedule_runs must be True, False or None"),
        ({"schedule_id": ""}, "schedule_id must be a non-empty string"),
        ({"schedule_id": "x", "schedule_runs": False}, "cannot go with schedule_runs=False"),
    ],
)
def test_bad_origin_filters_are_refused(executor, kwargs, message):
    with pytest.raises(ValueError, match=message):
        executor.list_tasks(**kwargs)


def test_one_schedule_s_runs_are_told_exactly(executor, clock):
    """The id's head compared exactly: letter case counts (SQLite's LIKE would not), and a
    schedule id of any characters is found (MariaDB's REGEXP counts bytes); an id longer
    than any schedule's finds nothing (no error)."""
    fire_runs(executor, clock, "nightly", 1)
    fire_runs(executor, clock, "Nightly", 1)
    fire_runs(executor, clock, "café-😀", 1)
    nightly = ids(executor.list_tasks(schedule_id="nightly"))
    assert nightly and all(task_id.startswith("nightly@") for task_id in nightly)
    assert executor.list_tasks(schedule_id="NIGHTLY") == []
    assert {t.task_id.split("@")[0] for t in executor.list_tasks(schedule_id="café-😀")} == {
        "café-😀"
    }
    assert executor.list_tasks(schedule_id="x" * 300) == []
