"""The summary's health parts on every storage: the chart of tasks completed, failed and retried
per minute (inline SVG, no script), each queue's sparkline of completions, and each queue's
oldest due task, amber and red past the admin's thresholds."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from django_reliable_executor.admin import ReliableTaskAdmin
from django_reliable_executor.admin.health import DueThresholds, chart, nice_ceiling, sparkline
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


def test_each_queue_shows_its_sparkline_of_completions(service, viewer):
    """populate() completed one task in queue "default" and none in "emails" (two failed
    there and in "default": failures are not completions)."""
    response = viewer.get(LIST_URL)
    summary = response.context["summary"]
    sparks = {q.queue: q.completed for q in summary["queues"]}
    assert set(sparks) == {"default", "emails"}
    assert (sparks["default"].total, sparks["default"].peak) == (1, 1)
    assert (sparks["emails"].total, sparks["emails"].peak) == (0, 0)
    assert summary["completed_all"].total == 1
    html = response.content.decode()
    assert "Completed 60 min</th>" in html
    for queue, title in [
        ("default", "default: 1 completed in the last 60 minutes, peak 1 a minute"),
        ("emails", "emails: none completed in the last 60 minutes"),
        ("", "All queues: 1 completed in the last 60 minutes, peak 1 a minute"),
    ]:
        row = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', html, re.S)
        assert row is not None
        svg = re.search(
            r'<td class="re-spark-cell">\s*<svg class="re-spark" (.*?)</svg>', row.group(1)
        )
        assert svg is not None, queue
        # The tooltip, and the image's name for screen readers; drawn on the server.
        assert f'role="img" aria-label="{title}"' in svg.group(1)
        assert f"<title>{title}</title>" in svg.group(1)
        points = re.search(r'<polyline class="re-spark-line" points="([^"]*)"', svg.group(1))
        assert points is not None and len(points.group(1).split()) == 60
    assert "<script" not in html.split('id="re-counts"', 1)[1].split("</table>", 1)[0]


def test_sparklines_are_drawn_for_the_first_queues_only(service, viewer, monkeypatch):
    monkeypatch.setattr("django_reliable_executor.admin.task_summary.SPARKLINE_QUEUES", 1)
    response = viewer.get(LIST_URL)
    sparks = {q.queue: q.completed for q in response.context["summary"]["queues"]}
    assert sparks["default"] is not None and sparks["emails"] is None
    html = response.content.decode()
    row = re.search(r'<tr data-queue="emails">(.*?)</tr>', html, re.S)
    assert row is not None and "re-spark" not in row.group(1).replace("re-spark-cell", "")
    assert "sparklines of its first 1 queues only" in row.group(1)
    assert "drawn for the first 1 queues only" in html


def test_sparkline_geometry():
    drawn = sparkline("q", [0] * 58 + [4, 2])
    assert (drawn.total, drawn.peak) == (6, 4)
    points = [tuple(map(float, p.split(","))) for p in drawn.points.split()]
    assert len(points) == 60
    assert points[0] == (2.0, drawn.baseline)  # zero sits on the baseline, left edge
    assert points[-2][1] == 2.0  # the peak touches the top
    assert points[-1] == (drawn.width - 2.0, drawn.baseline - (drawn.baseline - 2) / 2)
    assert drawn.area.startswith(f"2.0,{drawn.baseline} ") and drawn.area.endswith(
        f" {drawn.width - 2.0},{drawn.baseline}"
    )
    idle = sparkline("idle", [0] * 60)
    assert idle.title == "idle: none completed in the last 60 minutes"
    assert {float(p.split(",")[1]) for p in idle.points.split()} == {idle.baseline}


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
