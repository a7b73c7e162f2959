"""The admin's pure parts: durations, query strings, action messages, the slow-count cache."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

import pytest
from django.contrib import messages

from django_reliable_executor.admin import operations, task_summary
from django_reliable_executor.admin import task_pages as pages
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.exceptions import StorageUnavailableError


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.35, "350 ms"),
        (4.25, "4.2 s"),
        (185, "3 min 5 s"),
        (2 * 3600 + 600, "2 h 10 min"),
        (3 * 86400 + 4 * 3600, "3 d 4 h"),
        (-5, "-5.0 s"),
    ],
)
def test_format_duration(seconds, text):
    assert pages.format_duration(dt.timedelta(seconds=seconds)) == text


def test_filters_parse_and_build_query_strings():
    filters = pages.Filters.from_query(
        {"status": "FAILED", "queue": " emails ", "task_name": "", "page": "3"}
    )
    assert filters == pages.Filters(status=TaskStatus.FAILED, queue="emails", page=3)
    assert filters.url(page=4) == "?status=FAILED&queue=emails&page=4"
    assert filters.url(page=1) == "?status=FAILED&queue=emails"
    # Changing a filter goes back to the first page.
    assert filters.url(queue=None) == "?status=FAILED"
    assert pages.Filters().url() == "?"
    bad = pages.Filters.from_query({"status": "failed", "page": "-2"})
    assert (bad.status, bad.page) == (None, 1)


def test_dead_letters_filter_parses_builds_urls_and_totals():
    filters = pages.Filters.from_query({"status": "dead", "queue": "q", "page": "2"})
    assert (filters.dead_letters, filters.status, filters.page) == (True, None, 2)
    assert filters.active and filters.status_param == "dead"
    assert filters.statuses == {TaskStatus.FAILED, TaskStatus.TIMEOUT, TaskStatus.ERROR}
    assert filters.url(page=3) == "?status=dead&queue=q&page=3"
    assert filters.url(status="FAILED") == "?status=FAILED&queue=q"
    assert filters.url(status=None) == "?queue=q"
    assert pages.Filters(status=TaskStatus.FAILED).url(status="dead") == "?status=dead"
    counts = {s: 1 for s in TaskStatus}
    assert pages.matching_total(filters, {"q": counts, "other": counts}) == 3
    assert pages.matching_total(pages.Filters(dead_letters=True), {"q": counts, "o": counts}) == 6


def test_outcome_messages_and_levels():
    outcome = operations.Outcome("retried", changed=["a", "b", "c"])
    assert (outcome.message(), outcome.level) == ("3 tasks retried.", messages.SUCCESS)
    outcome.skipped = Counter({"not found": 1, "COMPLETED cannot be retried": 2})
    assert outcome.message() == (
        "3 tasks retried; 3 skipped: 2 COMPLETED cannot be retried, 1 not found."
    )
    assert outcome.level == messages.WARNING
    cancel = operations.Outcome("cancelled", changed=["a"], requested=["r"])
    assert cancel.message() == "1 task cancelled, cancel requested for 1 task running."


class FakeExecutor:
    """Just enough of the service for the operations and the count cache."""

    def __init__(self, down_after: int = 10**6) -> None:
        self.storage = object()
        self.calls = 0
        self.down_after = down_after
        self.retried: list[str] = []

    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]:
        self.calls += 1
        return {"default": {TaskStatus.CREATED: self.calls}}

    def get_task(self, task_id: str) -> Any:
        if len(self.retried) >= self.down_after:
            raise StorageUnavailableError("Redis at redis://x cannot be reached")

        class Task:
            status = TaskStatus.FAILED

        Task.task_id = task_id  # type: ignore[attr-defined]
        return Task

    def retry_task_or_reason(self, task_id: str) -> str | None:
        self.retried.append(task_id)
        return None


def test_an_unreachable_storage_stops_the_action_and_says_what_was_done():
    service: Any = FakeExecutor(down_after=2)
    outcome = operations.retry_tasks(service, ["a", "b", "c", "d"])
    assert service.retried == ["a", "b"]
    assert outcome.level == messages.ERROR
    assert outcome.message() == (
        "2 tasks retried; 2 skipped: 2 not attempted. "
        "Stopped: Redis at redis://x cannot be reached."
    )


def test_slow_counts_are_reused_for_a_while_fast_ones_never(monkeypatch):
    service: Any = FakeExecutor()
    fast = task_summary.SlowCounts(max_age=10, slow_seconds=60)
    assert fast.get(service)[0]["default"][TaskStatus.CREATED] == 1
    assert fast.get(service)[0]["default"][TaskStatus.CREATED] == 2  # read again

    clock = iter([100.0, 100.5, 103.0, 120.0, 120.5])
    monkeypatch.setattr(task_summary.time, "monotonic", lambda: next(clock))
    slow = task_summary.SlowCounts(max_age=10, slow_seconds=0.1)
    assert slow.get(service) == ({"default": {TaskStatus.CREATED: 3}}, 0.0)  # took 0.5 s
    assert slow.get(service) == ({"default": {TaskStatus.CREATED: 3}}, 3.0)  # reused
    assert slow.get(service)[0]["default"][TaskStatus.CREATED] == 4  # 20 s old: read again
    slow.forget()
    assert slow._saved is None
    # Counts of another storage (settings changed) are never reused.
    service.storage = object()
    monkeypatch.setattr(task_summary.time, "monotonic", lambda: 121.0)
    assert slow.get(service)[0]["default"][TaskStatus.CREATED] == 5
