"""A waiting task's page in a real browser (headless Chromium at 1280 px, as
test_admin_browser.py): the Waiting panel fits the page, and its "Send event" form resumes the
task. The screenshot goes to pytest's temporary directory, or to docs/images/ with
``RE_UPDATE_SCREENSHOTS=1``."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import (
    DOCS_IMAGES,
    admin_params,
    detail_url,
    executor_on,
    make_user,
    populate,
    run_one,
    wait_for_event,
)
from tests.support.contract_support import HOOKS


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_send_an_event_to_a_waiting_task_in_a_real_browser(
    backend, live_server, browser_page, tmp_path
):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with executor_on(backend) as service:
        populate(service)
        # In a thread of its own: Playwright's event loop runs in this one (see
        # test_admin_browser_steps.py).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(wait_for_event, service).result()
        make_user("ops", "view_reliabletask", "operate_reliabletask")
        url = detail_url("t-waits")
        page.goto(f"{live_server.url}/admin/login/?next={url}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{url}")

        panel = page.locator("#re-waiting")
        assert "event approved" in panel.inner_text().replace("\n", " ")
        width = page.viewport_size["width"]
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        assert page.locator("#re-send-event input[name=event]").input_value() == "approved"
        page.fill("#re-send-event input[name=payload]", '{"approved": true, "by": "ann"}')
        # From the top: the admin's app sidebar is sticky, so a full-page shot taken scrolled
        # down draws it halfway down the page.
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(shots / "admin-task-waiting.png"), full_page=True)

        page.click("#re-send-event button")
        page.wait_for_url(f"**{url}")
        assert "Event 'approved' sent." in page.locator(".messagelist").inner_text()
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                ran = pool.submit(run_one, service, "waits").result()
        finally:
            HOOKS.pop("t-waits", None)
        assert ran is TaskStatus.COMPLETED
        task = service.get_task("t-waits")
        assert task.result == {"payload": {"approved": True, "by": "ann"}}
