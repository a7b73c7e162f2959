"""The summary's health parts on every storage: the chart of tasks completed, failed and retried
per minute (inline SVG, no script) and each queue's oldest due task, amber and red past the
admin's thresholds."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from django_reliable_executor.admin import ReliableTaskAdmin
from django_reliable_executor.admin.health import DueThresholds, chart, nice_ceiling
from django_reliable_executor.core.minute_counts import MinuteCounts
from tests.support.admin_support import LIST_URL


def test_the_chart_shows_the_last_hours_endings(service, viewer):
    """populate() ended one task COMPLETED, two FAILED and sent one back to PENDING (retry),
    all within the last minute or two."""
    response = viewer.get(LIST_URL)
    chart_ = response.context["summary"]["throughput"]
    totals = {s.field: s.total for s in chart_.series}
    assert totals == {"completed": 1, "failed": 2, "retried": 1}
    assert len(chart_.columns) == 60
    html = response.content.decode()
    block = re.search(r'<div class="module" id="re-throughput">(.*?)</div>', html, re.S)
    assert block is not None
    svg = block.group(1)
    assert "<svg" in svg and "<script" not in svg  # drawn on the server
    assert len(re.findall(r"<polyline ", svg)) == 3
    assert len(re.findall(r"<rect ", svg)) == 60  # a tooltip per minute
    # A tooltip per minute; the endings may straddle a minute boundary, so sum them.
    titles = re.findall(r"UTC: (\d+) completed, (\d+) failed, (\d+) retried</title>", svg)
    assert len(titles) == 60
    assert [sum(int(t[i]) for t in titles) for i in range(3)] == [1, 2, 1]
    assert 'data-series="failed"' in svg
    assert "Failed <strong>2</strong>" in block.group(1)


def test_each_queue_shows_its_oldest_due_task_age(service, viewer):
    response = viewer.get(LIST_URL)
    summary = response.context["summary"]
    ages = {q.queue: q.oldest_due for q in summary["queues"]}
    # default: t-created is due and unclaimed; emails: t-later is not due for an hour.
    assert ages["emails"] is None
    assert ages["default"] is not None
    assert ages["default"].since == service.get_task("t-created").run_at
    assert ages["default"].level == "ok"
    assert summary["oldest_due"].since == ages["default"].since
    html = response.content.decode()
    row = re.search(r'<tr data-queue="default">(.*?)</tr>', html, re.S)
    assert row is not None and 'class="re-due re-due-ok"' in row.group(1)


def test_ages_past_the_thresholds_turn_amber_then_red(service, viewer, monkeypatch):
    monkeypatch.setattr(
        ReliableTaskAdmin, "due_thresholds", DueThresholds(amber_seconds=1e-6, red_seconds=1e-6)
    )
    html = viewer.get(LIST_URL).content.decode()
    row = re.search(r'<tr data-queue="default">(.*?)</tr>', html, re.S)
    assert row is not None and 'data-level="red"' in row.group(1)
    assert re.search(r'id="re-oldest-due">waiting <span class="re-due re-due-red"', html)


def test_due_levels():
    thresholds = DueThresholds()  # amber past 1 min, red past 5 min
    assert thresholds.level(dt.timedelta(seconds=60)) == "ok"
    assert thresholds.level(dt.timedelta(seconds=61)) == "amber"
    assert thresholds.level(dt.timedelta(seconds=300)) == "amber"
    assert thresholds.level(dt.timedelta(seconds=301)) == "red"
    with pytest.raises(ValueError, match="amber_seconds"):
        DueThresholds(amber_seconds=600, red_seconds=60)


def test_chart_geometry():
    start = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.timezone.utc)
    minutes = [MinuteCounts(start + dt.timedelta(minutes=i)) for i in range(60)]
    minutes[-1] = MinuteCounts(minutes[-1].minute, completed=37, failed=3, retried=0)
    drawn = chart(minutes)
    assert drawn.y_max == 50  # 37 rounded up to 1, 2 or 5 x 10^n
    completed = drawn.series[0]
    assert (completed.field, completed.total, completed.peak) == ("completed", 37, 37)
    points = [tuple(map(float, p.split(","))) for p in completed.points.split()]
    assert len(points) == 60
    assert points[0][1] == drawn.bottom  # zero sits on the axis
    assert points[-1][1] == pytest.approx(drawn.bottom - drawn.plot_height * 37 / 50, abs=0.1)
    assert [t.label for t in drawn.x_ticks] == ["12:00", "12:15", "12:30", "12:45", "now"]
    assert drawn.columns[-1].title == "12:59 UTC: 37 completed, 3 failed, 0 retried"
    assert not drawn.empty and chart(minutes[:-1]).empty
    assert [nice_ceiling(n) for n in (0, 1, 3, 7, 10, 11, 200, 201)] == [
        1,
        1,
        5,
        10,
        10,
        20,
        200,
        500,
    ]
