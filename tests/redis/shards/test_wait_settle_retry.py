"""A sharded wait_for whose check of the other shards, after its suspend, meets a shard out of
reach: the check is made again, so an awaited task that ended between its link and the suspend
still wakes the waiter; and when every try fails, the master's sweep of waits wakes it."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.exceptions import StorageUnavailableError
from tests.support.contract_support import HOOKS, run_claim

from .conftest import LEASE, S1, S2, complete

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def link_then_end(storage):
    """The storage's link of the awaited tasks, after which "racer" (shard 2) completes: its
    message finds the waiter still RUNNING."""
    link = storage._link_awaited

    def linked_then_ended(claim, task_ids):
        linked = link(claim, task_ids)
        complete(storage, S2, "racer")
        return linked

    return linked_then_ended


def test_a_blip_after_the_suspend_does_not_lose_the_wake_up(executor, storage):
    executor.submit("demo.echo", {}, task_id="racer", queue=S2)
    executor.submit("contract.hook", None, task_id="late", queue=S1)
    settle = storage._settle_remote
    calls: list[int] = []

    def blip_once(waiter, shard, remote):
        calls.append(1)
        if len(calls) == 1:
            raise StorageUnavailableError("shard 2 out of reach for a moment")
        return settle(waiter, shard, remote)

    storage._link_awaited, storage._settle_remote = link_then_end(storage), blip_once
    HOOKS["late"] = lambda context: sorted(context.wait_for("one", ["racer"]))
    try:
        (claim,) = storage.claim("w1", [S1], 10, LEASE)
        assert run_claim(executor, claim) is TaskStatus.PENDING
    finally:
        del storage._link_awaited, storage._settle_remote
    assert len(calls) == 2
    (claim,) = storage.claim("w1", [S1], 10, LEASE)
    assert run_claim(executor, claim) is TaskStatus.COMPLETED
    assert executor.get_task("late").result == ["racer"]


def test_the_sweep_of_waits_wakes_a_waiter_whose_check_gave_up(executor, storage, monkeypatch):
    executor.submit("demo.echo", {}, task_id="racer", queue=S2)
    executor.submit("contract.hook", None, task_id="late", queue=S1)

    def out_of_reach(waiter, shard, remote):
        raise StorageUnavailableError("shard 2 out of reach")

    storage._link_awaited, storage._settle_remote = link_then_end(storage), out_of_reach
    monkeypatch.setattr("django_reliable_executor.storage.redis.waits.time.sleep", lambda s: None)
    HOOKS["late"] = lambda context: sorted(context.wait_for("one", ["racer"]))
    try:
        (claim,) = storage.claim("w1", [S1], 10, LEASE)
        assert run_claim(executor, claim) is TaskStatus.PENDING
    finally:
        del storage._link_awaited, storage._settle_remote
    # Every check gave up: the waiter waits on, though what it waits for has ended.
    assert executor.get_task("late").waiting["kind"] == "tasks"
    assert storage.claim("w1", [S1], 10, LEASE) == []
    assert storage.settle_waits(500) >= 1  # the master's sweep (chores.SettleWaits)
    (claim,) = storage.claim("w1", [S1], 10, LEASE)
    assert run_claim(executor, claim) is TaskStatus.COMPLETED
    assert executor.get_task("late").result == ["racer"]
    assert storage.settle_waits(500) == 0  # nothing waits any more
