"""Each durable step's checkpoint written is announced, on every storage: the signal
``task_step_finished(task_id, task_name, step)`` and the counter
``reliable_executor_steps_finished_total{task_name, queue}``. A step whose stored result is given
back, one that raised, and one whose checkpoint was refused or rolled back are not."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from django.db import transaction
from prometheus_client import REGISTRY

from django_reliable_executor import LeaseLostError, TaskStatus, signals
from tests.conftest import DB_ALIASES, db_params, require
from tests.support.contract_support import HOOKS, LEASE, claim_one, recording, run_claim

STEPS = "reliable_executor_steps_finished_total"


def counted(queue: str, task_name: str = "contract.hook") -> float:
    return REGISTRY.get_sample_value(STEPS, {"task_name": task_name, "queue": queue}) or 0.0


def fresh_queue() -> str:
    """A queue of this test's own: its labelled series start from nothing in the registry."""
    return f"st-{uuid.uuid4().hex[:10]}"


def sent(recorder) -> list[tuple[str, str, str]]:
    return [(c["task_id"], c["task_name"], c["step"]) for c in recorder.calls]


def test_each_checkpoint_written_is_counted_and_signalled_once(executor, storage, clock):
    queue = fresh_queue()
    executor.submit("contract.hook", None, task_id="s", queue=queue)

    def handler(context):
        context.step("one", lambda: 1)
        if context.attempt == 1:
            with contextlib.suppress(ZeroDivisionError):
                context.step("raises", lambda: 1 / 0)  # stores nothing
            raise ConnectionError("after step one")
        context.step("two", lambda: {"b": 2})  # "one" comes back stored: not announced again
        return "done"

    HOOKS["s"] = handler
    with recording(signals.task_step_finished) as finished:
        assert run_claim(executor, claim_one(storage, queue=queue)) is TaskStatus.PENDING
        assert sent(finished) == [("s", "contract.hook", "one")]
        assert counted(queue) == 1
        clock.advance(2)
        assert run_claim(executor, claim_one(storage, queue=queue)) is TaskStatus.COMPLETED
    assert sent(finished) == [("s", "contract.hook", "one"), ("s", "contract.hook", "two")]
    assert finished.calls[0]["sender"].__name__ == "ReliableExecutor"
    assert counted(queue) == 2


def test_a_step_run_again_after_a_retry_from_it_is_announced_again(executor, storage, clock):
    queue = fresh_queue()
    executor.submit("contract.hook", None, task_id="r", queue=queue, retry_limit=0)

    def handler(context):
        context.step("one", lambda: 1)
        context.step("two", lambda: 2)
        if context.attempt == 1:
            raise ValueError("fails once")

    HOOKS["r"] = handler
    with recording(signals.task_step_finished) as finished:
        assert run_claim(executor, claim_one(storage, queue=queue)) is TaskStatus.FAILED
        assert executor.retry_task("r", from_step="two")
        assert run_claim(executor, claim_one(storage, queue=queue)) is TaskStatus.COMPLETED
    assert [step for _, _, step in sent(finished)] == ["one", "two", "two"]
    assert counted(queue) == 3


def test_a_refused_checkpoint_is_not_announced(executor, storage, clock):
    queue = fresh_queue()
    executor.submit("contract.hook", None, task_id="l", queue=queue)
    raised: list = []

    def handler(context):
        clock.advance(LEASE + 1)
        storage.recover_expired(10)  # this attempt no longer holds the task
        try:
            context.step("late", lambda: 1)
        except LeaseLostError as exc:
            raised.append(exc)
            raise

    HOOKS["l"] = handler
    with recording(signals.task_step_finished) as finished:
        run_claim(executor, claim_one(storage, queue=queue))
    assert len(raised) == 1
    assert finished.calls == [] and counted(queue) == 0


def test_a_failing_receiver_is_logged_and_the_step_still_returns(executor, storage, caplog):
    queue = fresh_queue()
    executor.submit("contract.hook", None, task_id="b", queue=queue)
    HOOKS["b"] = lambda context: context.step("one", lambda: "kept")

    def broken(**kwargs):
        raise RuntimeError("receiver broke")

    signals.task_step_finished.connect(broken, weak=False)
    try:
        assert run_claim(executor, claim_one(storage, queue=queue)) is TaskStatus.COMPLETED
    finally:
        signals.task_step_finished.disconnect(broken)
    assert executor.get_task("b").result == "kept"
    assert any("signal receiver" in r.getMessage() for r in caplog.records)
    assert counted(queue) == 1


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))  # atomic=True: the database storage
def test_an_atomic_step_is_announced_when_its_transaction_commits(executor, storage, alias):
    require(alias)
    queue = fresh_queue()
    executor.submit("contract.hook", None, task_id="a", queue=queue)
    seen: list = []

    def handler(context):
        with recording(signals.task_step_finished) as inside:
            with transaction.atomic(using=storage.transaction_alias):
                context.step("kept", lambda: 1, atomic=True)
                seen.append(len(inside.calls))  # not yet: the handler's transaction is open
            seen.append(len(inside.calls))
            try:
                with transaction.atomic(using=storage.transaction_alias):
                    context.step("undone", lambda: 2, atomic=True)
                    raise KeyError("rolls the checkpoint back")
            except KeyError:
                pass
            seen.append([c["step"] for c in inside.calls])

    HOOKS["a"] = handler
    assert run_claim(executor, claim_one(storage, queue=queue)) is TaskStatus.COMPLETED
    assert seen == [0, 1, ["kept"]]
    assert [s.name for s in executor.get_task("a").steps] == ["kept"]
    assert counted(queue) == 1
