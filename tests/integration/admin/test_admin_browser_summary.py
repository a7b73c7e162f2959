"""The summary's chart, sparklines and oldest-due ages in a real browser (Chromium through
Playwright), on SQLite and Redis: an hour of endings made through the storage's real
transitions under a moved clock, queues whose oldest due task is fresh, amber and red. With
``RE_UPDATE_SCREENSHOTS=1`` its screenshot of the summary goes to docs/images/admin-summary.png."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import os
import re

import pytest

from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.registry import key_limits
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import (
    DOCS_IMAGES,
    LIST_PATH,
    admin_params,
    executor_on,
    make_user,
    showcase,
)
from tests.support.contract_support import LEASE, new_task


def an_hour_of_endings(service: ReliableExecutor) -> dict[str, int]:
    """Tasks that ended in each of the 59 minutes before this one (a wave of completions, a few
    failures and retries), made through the storage's own claim, start, complete and fail with
    its clock moved back. Returns the totals by series. (Not 60: the chart's hour still holds
    them all when the minute turns while the test runs.)"""
    storage = service.storage
    now = service.clock.now()
    fake = FakeClock(now.replace(second=0, microsecond=0) - dt.timedelta(minutes=59))
    fake.advance(60)
    totals = {"completed": 0, "failed": 0, "retried": 0}
    real_clock, storage.clock = storage.clock, fake
    try:
        for minute in range(1, 60):
            completed = 14 + round(9 * math.sin(minute / 7)) + minute % 4
            failed = (2 if minute in (17, 18) else 0) + (1 if minute % 11 == 5 else 0)
            retried = 3 if 16 <= minute <= 19 else minute % 9 == 2
            outcomes = ["complete"] * completed + ["fail"] * failed + ["retry"] * int(retried)
            tasks = [
                dataclasses.replace(
                    new_task(f"history-{minute}-{i}", "demo.echo", None, fake.now()),
                    queue="history",
                    retry_interval=7_200_000,  # retried ones wait past the test
                )
                for i in range(len(outcomes))
            ]
            storage.enqueue(tasks)
            claims = storage.start_many(storage.claim("w", ["history"], len(tasks), LEASE), LEASE)
            done = []
            for claim, outcome in zip(claims, outcomes, strict=True):
                assert claim is not None
                if outcome == "complete":
                    done.append((claim, {"ok": True}))
                else:
                    storage.fail(claim, "ValueError: boom", retryable=outcome == "retry")
            storage.complete_many(done)
            totals["completed"] += completed
            totals["failed"] += failed
            totals["retried"] += int(retried)
            fake.advance(60)
    finally:
        storage.clock = real_clock
    return totals


def waiting_since(service: ReliableExecutor, queue: str, minutes: float) -> None:
    """A task of ``queue`` due for ``minutes`` and not claimed (no worker takes that queue)."""
    at = service.clock.now() - dt.timedelta(minutes=minutes)
    task = dataclasses.replace(new_task(f"{queue}-waiting", "demo.echo", None, at), queue=queue)
    service.storage.enqueue([task])


def tenants_held(service: ReliableExecutor) -> None:
    """demo.keyed (max_concurrency_per_key=2) tasks of two tenants claimed by a worker: three
    of four held, acme at its cap."""
    for key in ("acme", "acme", "acme", "globex"):
        service.submit("demo.keyed", {}, concurrency_key=key, queue="tenants")
    claims = service.storage.claim("w-tenants", ["tenants"], 10, LEASE, key_limits=key_limits())
    assert len(claims) == 3


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_the_summary_charts_the_last_hour_and_marks_late_queues(
    backend, live_server, browser_page, tmp_path
):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with executor_on(backend) as service:
        totals = an_hour_of_endings(service)
        showcase(service)
        waiting_since(service, "emails", 3)  # amber: past 1 minute
        waiting_since(service, "reports", 12)  # red: past 5 minutes
        tenants_held(service)
        make_user("ops", "view_reliabletask", "operate_reliabletask")
        page.goto(f"{live_server.url}/admin/login/?next={LIST_PATH}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{LIST_PATH}")

        chart = page.locator("#re-throughput svg")
        box = chart.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 60  # drawn, visible
        assert chart.locator("polyline").count() == 3
        assert chart.locator("rect").count() == 60
        # The showcase's tasks ended in the current minute, beside the hour's history.
        legend = page.locator(".re-chart-legend").inner_text()
        completed = re.search(r"Completed ([\d,]+)", legend)  # 1,035: grouped by thousands
        assert completed is not None
        assert int(completed.group(1).replace(",", "")) == totals["completed"] + 2
        assert f"Failed {totals['failed'] + 2}" in legend
        assert f"Retried {totals['retried'] + 1}" in legend
        # A minute's tooltip: hovering shows it (the browser's own title, no script).
        titles = chart.locator("rect title").evaluate_all("ts => ts.map(t => t.textContent)")
        assert re.fullmatch(r"\d\d:\d\d UTC: \d+ completed, \d+ failed, \d+ retried", titles[20])
        assert chart.locator("script").count() == 0

        def level(queue: str) -> str | None:
            cell = page.locator(f'#re-counts tr[data-queue="{queue}"] .re-oldest-due .re-due')
            return cell.get_attribute("data-level")

        assert level("emails") == "amber"
        assert level("reports") == "red"
        assert level("default") == "ok"
        red = page.locator('#re-counts tr[data-queue="reports"] .re-due')
        background = red.evaluate("e => getComputedStyle(e).backgroundColor")
        assert background == "rgb(185, 28, 28)"
        assert page.locator("#re-oldest-due .re-due").get_attribute("data-level") == "red"
        keys = page.locator('#re-key-limits tr[data-task-name="demo.keyed"]')
        assert keys.is_visible()
        assert re.fullmatch(r"demo\.keyed\s+2\s+3\s+2\s+acme 2/2 · globex 1/2", keys.inner_text())
        # Each queue's sparkline of completions beside its counts: drawn, visible, named for
        # screen readers with its total and peak (the tooltip too); history's hour of waves.
        rows = page.locator("#re-counts tr[data-queue]")
        sparks = page.locator("#re-counts tr[data-queue] svg.re-spark")
        assert sparks.count() == rows.count() > 2
        for index in range(sparks.count()):
            spark_box = sparks.nth(index).bounding_box()
            assert spark_box is not None and spark_box["width"] >= 50 and spark_box["height"] >= 14
        history = page.get_by_role("img", name=re.compile(r"^history: "))
        assert history.is_visible()
        assert history.get_attribute("data-total") == str(totals["completed"])
        name = history.get_attribute("aria-label")
        assert re.fullmatch(
            rf"history: {totals['completed']} completed in the last 60 minutes, "
            r"peak \d+ a minute",
            name or "",
        )
        assert history.locator("title").text_content() == name
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        if backend == "default":
            page.locator(".re-summary").screenshot(path=str(shots / "admin-summary.png"))
            page.screenshot(path=str(tmp_path / "summary-page.png"), full_page=True)
        # The wider table still fits its box: the last column's buttons are not cut off.
        table = page.locator("#re-counts table").bounding_box()
        module = page.locator("#re-counts").bounding_box()
        assert table is not None and module is not None
        # (2 px: sub-pixel borders)
        assert table["x"] + table["width"] <= module["x"] + module["width"] + 2
