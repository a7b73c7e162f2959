"""context.set_progress(): stored and read back as TaskInfo.progress, coalesced per task, the
last report written by the task's end, fenced like every write of a claim, bad input refused."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.progress import make_progress
from tests.support.contract_support import (
    HOOKS,
    LEASE,
    claim_and_start,
    claim_one,
    run_claim,
    task_runner,
)


def test_progress_is_none_before_any_report_and_the_last_report_is_read_back(executor, clock):
    executor.submit("contract.hook", None, task_id="p")
    assert executor.get_task("p").progress is None

    def report(context):
        context.set_progress(3, 10, "three of ten")

    HOOKS["p"] = report
    run_claim(executor, claim_one(executor.storage))
    info = executor.get_task("p")
    assert info.status is TaskStatus.COMPLETED
    assert info.progress == {
        "current": 3,
        "total": 10,
        "message": "three of ten",
        "updated_at": clock.now(),
    }


def test_reports_within_the_interval_are_coalesced_and_the_last_is_written_by_the_end(
    executor, storage
):
    """A write interval no test can outlast: the first report is written (by the writer's
    thread, while the handler runs), the next ones only kept, and the last of them written
    when the handler returns, before its outcome."""
    executor.submit("contract.hook", None, task_id="c")
    writes: list[list[tuple[str, float]]] = []
    seen_while_running: list[object] = []
    record_progress = storage.record_progress

    def counted(reports):
        writes.append([(claim.task_id, progress["current"]) for claim, progress in reports])
        return record_progress(reports)

    storage.record_progress = counted

    with task_runner(executor) as runner:
        runner.progress.interval = 3600.0

        def report(context):
            context.set_progress(1, None, "first")
            # The first report is written at once, by the writer's thread.
            for _ in range(1000):
                if not runner.progress.pending("c"):
                    break
                time.sleep(0.01)
            seen_while_running.append(executor.get_task("c").progress["current"])
            for current in (2, 3, 4):
                context.set_progress(current, None, f"report {current}")
            seen_while_running.append(executor.get_task("c").progress["current"])

        HOOKS["c"] = report
        status = runner.run(claim_one(storage))
    assert status is TaskStatus.COMPLETED
    assert seen_while_running == [1, 1]  # 2, 3 and 4 waited for the interval's end
    assert writes == [[("c", 1)], [("c", 4)]]  # 2 and 3 never written: the latest wins
    info = executor.get_task("c")
    assert (info.status, info.progress["current"], info.progress["message"]) == (
        TaskStatus.COMPLETED,
        4,
        "report 4",
    )


def test_a_report_after_the_lease_was_lost_is_not_stored(executor, storage, clock):
    """Fenced: the first holder's claim no longer holds (its task was retried and claimed
    again by another worker); its report changes nothing, the new holder's is stored."""
    executor.submit("contract.hook", None, task_id="f", retry_interval=0)
    first = claim_and_start(storage, "w1")
    assert storage.fail(first, "lost", retryable=True) is not None
    second = claim_and_start(storage, "w2")
    assert storage.record_progress([(first, make_progress(5, 10, "stale", clock.now()))]) == 0
    assert executor.get_task("f").progress is None
    assert storage.record_progress([(second, make_progress(2, 10, "", clock.now()))]) == 1
    assert executor.get_task("f").progress["current"] == 2
    # Finished: no report is stored any more, even under the right token.
    assert storage.complete(second, "ok") is not None
    assert storage.record_progress([(second, make_progress(9, 10, "late", clock.now()))]) == 0
    assert executor.get_task("f").progress["current"] == 2


def test_a_report_of_a_claim_not_started_is_not_stored(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="u")
    claim = claim_one(storage)
    assert storage.record_progress([(claim, make_progress(1, 2, "", clock.now()))]) == 0
    assert executor.get_task("u").progress is None
    storage.release([claim])


def test_a_retry_by_hand_clears_the_progress(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="r", retry_limit=0)
    claim = claim_and_start(storage)
    assert storage.record_progress([(claim, make_progress(7, 10, "", clock.now()))]) == 1
    assert storage.fail(claim, "boom", retryable=False).status is TaskStatus.FAILED
    assert executor.get_task("r").progress["current"] == 7  # kept on the finished task
    assert executor.retry_task("r")
    assert executor.get_task("r").progress is None


BAD = [
    ((True,), {}, TypeError, "current must be a number, not bool"),
    (("1",), {}, TypeError, "current must be a number, not str"),
    ((-1,), {}, ValueError, "current must be 0 or more"),
    ((float("nan"),), {}, ValueError, "current must be a finite number"),
    ((1, False), {}, TypeError, "total must be a number, not bool"),
    ((1, -2), {}, ValueError, "total must be 0 or more"),
    ((3, 2), {}, ValueError, r"current \(3\) must not exceed total \(2\)"),
    ((1, 2, 3), {}, TypeError, "message must be a str, not int"),
    ((1,), {"message": "x" * 1001}, ValueError, "message must be at most 1000 characters"),
]


def test_bad_arguments_raise_in_the_handler_naming_the_argument_and_store_nothing(executor):
    executor.submit("contract.hook", None, task_id="bad")
    raised: list[str] = []

    def report(context):
        for args, kwargs, error, match in BAD:
            with pytest.raises(error, match=match):
                context.set_progress(*args, **kwargs)
            raised.append(match)
        return "survived"

    HOOKS["bad"] = report
    run_claim(executor, claim_one(executor.storage))
    info = executor.get_task("bad")
    assert len(raised) == len(BAD)
    assert (info.status, info.result, info.progress) == (TaskStatus.COMPLETED, "survived", None)


def test_reports_of_several_tasks_in_one_write_are_fenced_each_on_its_own(executor, storage, clock):
    for task_id in ("b1", "b2"):
        executor.submit("contract.hook", None, task_id=task_id)
    claims = {
        c.task_id: c for c in storage.start_many(storage.claim("w1", ["default"], 2, LEASE), LEASE)
    }
    assert storage.release([]) == 0
    assert storage.cancel("b2").changed  # RUNNING: only asks; the claim still holds
    assert storage.fail(claims["b2"], "stopped", retryable=False).status is TaskStatus.CANCELLED
    reports = [(claims[i], make_progress(n, 5, i, clock.now())) for n, i in ((1, "b1"), (2, "b2"))]
    assert storage.record_progress(reports) == 1
    assert executor.get_task("b1").progress["message"] == "b1"
    assert executor.get_task("b2").progress is None
    assert storage.record_progress([]) == 0
