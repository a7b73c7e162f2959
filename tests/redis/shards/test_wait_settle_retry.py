"""A sharded wait_for whose check of the other shards, after its suspend, meets a shard out of
reach once: the check is made again, so an awaited task that ended between its link and the
suspend still wakes the waiter."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.exceptions import StorageUnavailableError
from tests.support.contract_support import HOOKS, run_claim

from .conftest import LEASE, S1, S2, complete

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def test_a_blip_after_the_suspend_does_not_lose_the_wake_up(executor, storage):
    executor.submit("demo.echo", {}, task_id="racer", queue=S2)
    executor.submit("contract.hook", None, task_id="late", queue=S1)
    link, settle = storage._link_awaited, storage._settle_remote
    calls: list[int] = []

    def link_then_end(claim, task_ids):
        linked = link(claim, task_ids)
        complete(storage, S2, "racer")  # its message finds the waiter still RUNNING
        return linked

    def blip_once(claim, remote):
        calls.append(1)
        if len(calls) == 1:
            raise StorageUnavailableError("shard 2 out of reach for a moment")
        return settle(claim, remote)

    storage._link_awaited, storage._settle_remote = link_then_end, blip_once
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
