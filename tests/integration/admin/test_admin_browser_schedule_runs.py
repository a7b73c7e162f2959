"""A schedule's page in a real browser (Chromium through Playwright), on SQLite and Redis: the
timing in plain words, the next five fire times, and "Run now" pressed twice storing one run."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.admin.utils import quote
from django.urls import reverse

from tests.support.admin_support import admin_params, executor_on, make_user

UTC = dt.timezone.utc


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_a_schedule_page_reads_in_words_and_runs_now_once(
    backend, live_server, browser_page, tmp_path
):
    page = browser_page
    with executor_on(backend) as service:
        service.schedule(
            "weekday-report", "contract.hook", cron="0 9 * * 1-5", timezone="Europe/Paris"
        )
        make_user("ops", "view_reliableschedule", "change_reliableschedule")
        path = reverse(
            "admin:django_reliable_executor_reliableschedule_change",
            args=[quote("weekday-report")],
        )
        page.goto(f"{live_server.url}/admin/login/?next={path}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{path}")

        assert page.locator("#re-words").inner_text() == "every weekday at 09:00 (Europe/Paris)"
        local = page.locator("#re-upcoming td.re-fire-local").all_inner_texts()
        utc = page.locator("#re-upcoming td.re-fire-utc").all_inner_texts()
        assert len(local) == len(utc) == 5
        for text in local:
            day, _, time, zone = text.split(" ")
            assert day in ("Mon", "Tue", "Wed", "Thu", "Fri") and time == "09:00", text
            assert zone in ("CET", "CEST"), text
        assert all(t.endswith(("07:00 UTC", "08:00 UTC")) for t in utc), utc
        assert page.locator("#re-activity svg.re-hours").get_attribute("data-completed") == "0"

        def runs() -> list[str]:
            return [t.task_id for t in service.list_tasks(schedule_id="weekday-report")]

        assert runs() == []
        page.click("#re-run-now")
        page.wait_for_selector("text=1 schedule fired now")
        (first,) = runs()
        page.click("#re-run-now")
        page.wait_for_selector("text=1 run by hand earlier, not finished yet")
        assert runs() == [first]
        assert first in page.locator(".messagelist").inner_text()
        assert page.locator(f'#re-fires tr[data-task-id="{first}"]').count() == 1
        assert service.get_schedule("weekday-report").last_task_id is None  # no planned fire
        page.screenshot(path=str(tmp_path / "schedule-page.png"), full_page=True)
