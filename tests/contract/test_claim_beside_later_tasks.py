"""A claim beside many tasks due later (delayed, backing off, in a durable wait) takes every due
task, in pickup order, whatever their priorities.

MariaDB stops the claim's first read after EXAMINED index entries (claim_ranges.py), then reads
the due tasks priority by priority: here more tasks due tomorrow than that stand between the
due ones, at the priorities of the due ones, in two queues and in a capped name's lane."""

from __future__ import annotations

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.storage.database.claim_ranges import EXAMINED, MAX_PRIORITIES
from tests.support.contract_support import LEASE

NAME = "demo.echo"
CAPPED = "demo.chaos_capped"  # max_concurrency=2: its claims read its own lane
TOMORROW = 86_400_000


def submit_later(executor, name: str, queue: str, priority: int, n: int) -> None:
    requests = [
        TaskSubmitRequest(name, None, queue=queue, priority=priority, delay_millis=TOMORROW)
        for _ in range(n)
    ]
    for start in range(0, n, 500):
        executor.submit_many(requests[start : start + 500])


def test_a_claim_takes_the_due_tasks_beside_many_due_later(executor, storage):
    later = EXAMINED + 200
    submit_later(executor, NAME, "default", 5, later // 2)
    submit_later(executor, NAME, "default", 0, later)
    submit_later(executor, NAME, "other", 0, later // 2)
    due = {
        "high": executor.submit(NAME, None, priority=5, task_id="high"),
        "mid-1": executor.submit(NAME, None, priority=0, task_id="mid-1"),
        "mid-2": executor.submit(NAME, None, priority=0, task_id="mid-2"),
        "low": executor.submit(NAME, None, priority=-5, task_id="low"),
        "other": executor.submit(NAME, None, queue="other", priority=0, task_id="other"),
    }
    claims = storage.claim("w1", ["default", "other"], 10, LEASE)
    taken = [claim.task_id for claim in claims]
    assert sorted(taken) == sorted(due), taken
    assert taken.index("high") < taken.index("mid-1") < taken.index("mid-2") < taken.index("low")
    assert storage.claim("w2", ["default", "other"], 10, LEASE) == []


def test_a_short_claim_takes_no_more_than_its_limit_beside_many_due_later(executor, storage):
    submit_later(executor, NAME, "default", 0, EXAMINED + 200)
    for i in range(3):
        executor.submit(NAME, i, priority=-1)
    first = storage.claim("w1", ["default"], 2, LEASE)
    second = storage.claim("w2", ["default"], 2, LEASE)
    assert (len(first), len(second)) == (2, 1)
    assert {c.task_id for c in first}.isdisjoint(c.task_id for c in second)


def test_a_capped_names_claim_takes_its_due_tasks_beside_many_due_later(executor, storage):
    submit_later(executor, CAPPED, "default", 0, EXAMINED + 200)
    executor.submit(CAPPED, {"sleep": 0}, priority=-3, task_id="capped-due")
    claims = storage.claim("w1", ["default"], 8, LEASE, name_limits={CAPPED: 2})
    assert [claim.task_id for claim in claims] == ["capped-due"]


def test_a_round_with_limited_names_finds_other_due_tasks_beside_many_due_later(executor, storage):
    """With capped or rate-limited names in the round, one read first finds which lanes have
    work due (RateLog.due_names): bounded the same way, it still finds the one due task."""
    submit_later(executor, NAME, "default", 0, EXAMINED + 200)
    executor.submit(NAME, None, priority=-2, task_id="due")
    claims = storage.claim("w1", ["default"], 8, LEASE, name_limits={CAPPED: 2})
    assert [claim.task_id for claim in claims] == ["due"]


def test_a_claim_beside_more_waiting_priorities_than_it_dives_for_reads_unbounded(
    executor, storage
):
    """Past MAX_PRIORITIES distinct priorities waiting in the lane, the claim reads unbounded
    (as before the ranges), and still finds the due task below them all."""
    per_priority = EXAMINED // MAX_PRIORITIES + 10
    for priority in range(1, MAX_PRIORITIES + 2):
        submit_later(executor, NAME, "default", priority, per_priority)
    executor.submit(NAME, None, priority=0, task_id="due")
    claims = storage.claim("w1", ["default"], 8, LEASE)
    assert [claim.task_id for claim in claims] == ["due"]
