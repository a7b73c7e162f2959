"""The admin in a real browser: headless Chromium (Debian's ``chromium`` package) driven by
Playwright against a live server of the test project, on SQLite and on Redis storage.

Logs in, reads the list and its summary, filters, opens a failed task, retries it, cancels a
pending one from the list; then pauses a schedule from the schedule list and resumes it from its
page. Screenshots of the task list, task and schedule list pages go to pytest's temporary
directory, or to docs/images/ with ``RE_UPDATE_SCREENSHOTS=1`` (how the ones in the docs are made).
A missing Playwright or browser skips locally and fails under CI.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from typing import Any

import pytest

from django_reliable_executor import Schedule
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import (
    DOCS_IMAGES,
    LIST_PATH,
    admin_params,
    executor_on,
    fire_schedule,
    make_user,
    run_one,
    showcase,
)


def assert_filter_beside_the_list(page: Any) -> None:
    """The layout Django's admin gives a change list, on 5.2 as on 6.x: the filter sidebar to
    the right of the table (not under it), both within the page's width."""
    table = page.locator("#result_list").bounding_box()
    columns = page.evaluate(
        "[...document.querySelectorAll('#result_list thead th')]"
        ".map(th => th.innerText.trim() + ' ' + th.offsetWidth)"
    )
    side = page.locator("#changelist-filter").bounding_box()
    width = page.viewport_size["width"]
    assert side["x"] >= table["x"] + table["width"] - 1, (
        "filter not beside the table (the table too wide?)",
        table,
        side,
        columns,
    )
    assert side["y"] < table["y"] + table["height"], ("filter under the table", table, side)
    assert table["x"] + table["width"] <= width and side["x"] + side["width"] <= width, (
        "wider than the page",
        width,
        table,
        side,
    )
    # Nothing scrolls sideways: neither the page nor the table's own box.
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    results = "document.querySelector('#changelist-form .results')"
    assert page.evaluate(f"{results}.scrollWidth <= {results}.clientWidth"), columns


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_operate_tasks_in_a_real_browser(backend, live_server, browser_page, tmp_path):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with executor_on(backend) as service:
        showcase(service)
        make_user("ops", "view_reliabletask", "operate_reliabletask")

        # Log in: the admin's login page sends us on to the task list.
        page.goto(f"{live_server.url}/admin/login/?next={LIST_PATH}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{LIST_PATH}")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 9
        assert rows.first.get_attribute("data-task-id") == "order-1044-pay"  # newest first
        assert page.locator("#re-master").inner_text() == "web-1:4242"
        assert "Live workers: 2" in page.locator("#re-workers").inner_text()
        failed_count = page.locator('#re-counts tr[data-queue="reports"] td[data-status="FAILED"]')
        assert failed_count.inner_text() == "1"
        exporting = page.locator('#result_list tr[data-task-id="export-customers"]')
        assert "1840 of 5000 (36%): customers exported" in exporting.inner_text()
        assert page.locator("#re-throughput svg polyline").count() == 3
        # Each queue's sparkline of completions, beside its counts, visible and named.
        sparks = page.locator("#re-counts tr[data-queue] svg.re-spark")
        assert sparks.count() == page.locator("#re-counts tr[data-queue]").count()
        for index in range(sparks.count()):
            assert sparks.nth(index).is_visible()
            box = sparks.nth(index).bounding_box()
            assert box is not None and box["width"] >= 50 and box["height"] >= 14
        reports = page.get_by_role("img", name=re.compile(r"^reports: "))
        assert reports.is_visible()
        assert_filter_beside_the_list(page)
        if backend == "default":
            page.screenshot(path=str(shots / "admin-list.png"), full_page=True)

        # Filter by status from the sidebar, then open a failed task.
        page.locator("#changelist-filter").get_by_role("link", name="FAILED", exact=True).click()
        page.wait_for_url("**status=FAILED")
        assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.taskId)")) == [
            "order-1042-pay",
            "report-2024-w18",
        ]
        page.get_by_role("link", name="order-1042-pay").click()
        page.wait_for_url("**/order-1042-pay/change/")
        error = page.locator("#re-error pre").inner_text()
        assert "Traceback (most recent call last)" in error and "PaymentDeclined" in error
        assert '"amount": -5.0' in page.locator("#re-parameter pre").inner_text()
        if backend == "default":
            page.screenshot(path=str(shots / "admin-detail.png"), full_page=True)

        # Retry it with the page's button.
        page.click("#re-retry")
        page.wait_for_load_state()
        assert page.locator("ul.messagelist li").inner_text() == "1 task retried."
        assert page.locator("#re-status-line .re-status").inner_text() == "PENDING"
        assert service.get_task("order-1042-pay").status is TaskStatus.PENDING

        # Cancel a pending task from the list: tick it, choose the action, Go.
        page.goto(f"{live_server.url}{LIST_PATH}?status=PENDING")
        page.check('input.action-select[value="sync-inventory-17"]')
        page.select_option("#re-action", "cancel")
        page.click("#changelist-form .actions button[type=submit]")
        page.wait_for_load_state()
        assert page.locator("ul.messagelist li").inner_text() == "1 task cancelled."
        assert [r for r in rows.evaluate_all("rs => rs.map(r => r.dataset.taskId)")] == [
            "order-1042-pay"
        ]
        assert service.get_task("sync-inventory-17").status is TaskStatus.CANCELLED
        assert service.get_task("order-1042-pay").status is TaskStatus.PENDING


SCHEDULES_PATH = "/admin/django_reliable_executor/reliableschedule/"


def schedule_showcase(service: ReliableExecutor) -> None:
    """Schedules an operator would meet, fired in the past through the storage's real fire and
    run by the demo's handlers: one COMPLETED, one FAILED, one waiting, one paused."""
    utc = dt.timezone.utc
    now = service.clock.now().astimezone(utc).replace(microsecond=0)
    service.schedule(
        "cleanup-sessions", "demo.echo", {"older_than_days": 14}, every=900, queue="maintenance"
    )
    fire_schedule(service, "cleanup-sessions", now - dt.timedelta(minutes=10))
    assert run_one(service, "maintenance", "web-1:4242") is TaskStatus.COMPLETED
    service.schedule(
        "nightly-report",
        "demo.always_fails",
        {"report": "sales", "formats": ["pdf", "csv"]},
        cron="0 3 * * *",
        timezone="Europe/Paris",
        queue="reports",
        retry_limit=0,
    )
    last_night = service.get_schedule("nightly-report").next_run_at - dt.timedelta(days=1)
    fire_schedule(service, "nightly-report", last_night)
    assert run_one(service, "reports", "web-1:4242") is TaskStatus.FAILED
    service.schedule_many(
        [
            Schedule(
                schedule_id="sync-inventory",
                task_name="demo.flaky",
                parameter={"fail_times": 0},
                every=300,
            )
        ],
        origin="code",
    )
    fire_schedule(service, "sync-inventory", now - dt.timedelta(seconds=20))
    service.schedule(
        "weekly-digest",
        "demo.echo",
        {"template": "digest"},
        cron="0 8 * * 1",
        timezone="Europe/London",
        queue="emails",
    )
    assert service.pause_schedule("weekly-digest") is not None


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_pause_a_schedule_in_a_real_browser(backend, live_server, browser_page, tmp_path):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with executor_on(backend) as service:
        schedule_showcase(service)
        make_user("ops", "view_reliableschedule", "change_reliableschedule")

        page.goto(f"{live_server.url}/admin/login/?next={SCHEDULES_PATH}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{SCHEDULES_PATH}")
        rows = page.locator("#result_list tbody tr")
        assert rows.evaluate_all("rs => rs.map(r => r.dataset.scheduleId)") == [
            "cleanup-sessions",
            "nightly-report",
            "sync-inventory",
            "weekly-digest",
        ]
        statuses = rows.evaluate_all("rs => rs.map(r => r.dataset.lastStatus || null)")
        assert statuses == ["COMPLETED", "FAILED", "CREATED", None]
        counts = page.locator("#re-schedule-counts")
        assert counts.locator('td[data-state="paused"]').inner_text() == "1"
        assert counts.locator('td[data-state="active"]').inner_text() == "3"
        assert_filter_beside_the_list(page)
        if backend == "default":
            page.screenshot(path=str(shots / "admin-schedules.png"), full_page=True)

        # Pause one from the list: tick it, choose the action, Go.
        page.check('input.action-select[value="nightly-report"]')
        page.select_option("#re-action", "pause")
        page.click("#changelist-form .actions button[type=submit]")
        page.wait_for_load_state()
        assert page.locator("ul.messagelist li").inner_text() == "1 schedule paused."
        row = page.locator('#result_list tr[data-schedule-id="nightly-report"]')
        assert row.get_attribute("data-paused") == "true"
        assert row.locator(".re-state").inner_text() == "paused"
        assert counts.locator('td[data-state="paused"]').inner_text() == "2"
        assert service.get_schedule("nightly-report").paused

        # Its page: the failed fire links to its task; Resume puts it back.
        row.get_by_role("link", name="nightly-report").click()
        page.wait_for_url("**/nightly-report/change/")
        fire = page.locator("#re-fires tbody tr").first
        assert fire.get_attribute("data-status") == "FAILED"
        page.click("#re-resume")
        page.wait_for_load_state()
        assert page.locator("ul.messagelist li").inner_text() == "1 schedule resumed."
        assert page.locator("#re-state-line .re-active").inner_text() == "active"
        assert not service.get_schedule("nightly-report").paused
