"""Pause and resume a queue with the summary's buttons in a real browser (Chromium through
Playwright), on SQLite and Redis."""

from __future__ import annotations

import pytest

from tests.support.admin_support import LIST_PATH, admin_params, executor_on, make_user, showcase


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_pause_and_resume_a_queue_in_a_real_browser(backend, live_server, browser_page):
    page = browser_page
    with executor_on(backend) as service:
        showcase(service)
        make_user("ops", "view_reliabletask", "operate_reliabletask")
        page.goto(f"{live_server.url}/admin/login/?next={LIST_PATH}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{LIST_PATH}")

        row = page.locator('#re-counts tr[data-queue="emails"]')
        assert row.locator(".re-queue-state").inner_text().startswith("running")
        row.get_by_role("button", name="Pause queue emails").click()
        page.wait_for_selector("#re-paused-queues")
        assert "Queue emails paused" in page.locator(".messagelist").inner_text()
        assert service.paused_queues() == {"emails"}
        row = page.locator('#re-counts tr[data-queue="emails"]')
        assert row.locator(".re-queue-state").inner_text().startswith("paused")

        row.get_by_role("button", name="Resume queue emails").click()
        page.wait_for_selector("text=Queue emails resumed")
        assert service.paused_queues() == set()
        assert page.locator("#re-paused-queues").count() == 0
