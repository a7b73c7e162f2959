"""A dependent retried by hand across shards: it waits again for a dependency of another shard
that has not ended (registered there again), and is refused when one ended otherwise."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus

from .conftest import S0, S1, S2, complete, due, fail, outbox_lengths, status

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])


def test_a_cancelled_dependent_retried_waits_for_its_dependency_on_another_shard(executor, storage):
    executor.submit("demo.echo", {}, task_id="a", queue=S0)
    executor.submit("demo.echo", {}, task_id="b", queue=S1, depends_on=["a"])
    assert executor.cancel_task("b")
    assert executor.retry_task_or_reason("b") is None
    b = executor.get_task("b")
    assert b.status is TaskStatus.CREATED and b.waiting_for == ("a",)
    assert storage.claim("w1", [S1], 10, 30.0) == []
    complete(storage, S0, "a")
    assert due(executor, "b")
    assert outbox_lengths(storage) == [0, 0, 0]


def test_a_retried_dependent_is_refused_when_its_dependency_on_another_shard_failed(
    executor, storage
):
    executor.submit("demo.echo", {}, task_id="a", queue=S2)
    executor.submit("demo.echo", {}, task_id="b", queue=S1, depends_on=["a"])
    executor.submit(
        "demo.echo", {}, task_id="runs", queue=S1, depends_on=["a"], on_dependency_failure="run"
    )
    assert executor.cancel_task("runs")
    fail(storage, S2, "a")
    assert status(executor, "b") is TaskStatus.CANCELLED
    reason = executor.retry_task_or_reason("b")
    assert reason is not None and "dependency a ended FAILED" in reason
    assert status(executor, "b") is TaskStatus.CANCELLED
    assert executor.retry_task_or_reason("runs") is None
    assert due(executor, "runs")


def test_a_dependency_ending_between_the_link_and_the_retry_still_releases_it(
    executor, storage, monkeypatch
):
    executor.submit("demo.echo", {}, task_id="a", queue=S0)
    executor.submit("demo.echo", {}, task_id="b", queue=S1, depends_on=["a"])
    assert executor.cancel_task("b")
    link = storage._link_for_retry
    ended: list[str] = []

    def link_then_end(*args):
        linked = link(*args)
        if not ended:  # another worker completes a now: its message finds b not waiting yet
            ended.append("a")
            complete(storage, S0, "a")
            assert status(executor, "b") is TaskStatus.CANCELLED
        return linked

    monkeypatch.setattr(storage, "_link_for_retry", link_then_end)
    assert executor.retry_task_or_reason("b") is None
    assert ended == ["a"]
    assert due(executor, "b")
