"""Durable waits on a sharded Redis storage: a wait_for on one shard of tasks stored on others
is woken by their endings' messages (linked first with dep_link.lua), even one that ended
between its link and the wait; an event reaches a task on its own shard."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from tests.support.contract_support import HOOKS, run_claim

from .conftest import LEASE, S0, S1, S2, complete

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def run_one(executor, storage, queue):
    claims = storage.claim("w1", [queue], 10, LEASE)
    assert len(claims) == 1, [c.task_id for c in claims]
    return run_claim(executor, claims[0])


def test_a_wait_for_tasks_of_other_shards_resumes_once_the_last_ends(executor, storage):
    for task_id, queue in (("x0", S0), ("x2", S2)):
        executor.submit("demo.echo", {}, task_id=task_id, queue=queue)
    executor.submit("contract.hook", None, task_id="waiter", queue=S1)

    def waiter(context):
        ended = context.wait_for("both", ["x0", "x2"])
        return {k: v.status.value for k, v in ended.items()}

    HOOKS["waiter"] = waiter
    assert run_one(executor, storage, S1) is TaskStatus.PENDING
    assert sorted(executor.get_task("waiter").waiting_for) == ["x0", "x2"]
    assert storage.claim("w1", [S1], 10, LEASE) == []
    complete(storage, S0, "x0")
    assert storage.claim("w1", [S1], 10, LEASE) == []  # x2 has not ended
    complete(storage, S2, "x2")
    assert run_one(executor, storage, S1) is TaskStatus.COMPLETED
    assert executor.get_task("waiter").result == {"x0": "COMPLETED", "x2": "COMPLETED"}


def test_a_task_of_another_shard_ending_between_link_and_wait_still_wakes_it(executor, storage):
    executor.submit("demo.echo", {}, task_id="racer", queue=S2)
    executor.submit("contract.hook", None, task_id="late", queue=S1)
    original = storage._link_awaited

    def link_then_end(claim, task_ids):
        linked = original(claim, task_ids)
        complete(storage, S2, "racer")  # its message finds the waiter still RUNNING
        return linked

    storage._link_awaited = link_then_end
    HOOKS["late"] = lambda context: sorted(context.wait_for("one", ["racer"]))
    try:
        assert run_one(executor, storage, S1) is TaskStatus.PENDING
    finally:
        del storage._link_awaited
    assert run_one(executor, storage, S1) is TaskStatus.COMPLETED
    assert executor.get_task("late").result == ["racer"]


def test_an_event_reaches_a_task_on_its_shard(executor, storage):
    executor.submit("contract.hook", None, task_id="evt", queue=S2)
    HOOKS["evt"] = lambda context: context.wait_for_event("go")
    assert run_one(executor, storage, S2) is TaskStatus.PENDING
    assert executor.send_event("evt", "go", 5)
    assert run_one(executor, storage, S2) is TaskStatus.COMPLETED
    assert executor.get_task("evt").result == 5
    assert executor.count_waiting() == {"sleep": 0, "event": 0, "tasks": 0}
