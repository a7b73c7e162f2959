"""A task's step timeline in a real browser (headless Chromium at 1280 px, as
test_admin_browser.py): it fits the page, and "Retry from this step" retries the task from that
step. The screenshot goes to pytest's temporary directory, or to docs/images/ with
``RE_UPDATE_SCREENSHOTS=1``."""

from __future__ import annotations

import concurrent.futures
import os

import pytest

from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import (
    DOCS_IMAGES,
    STEPS,
    admin_params,
    detail_url,
    executor_on,
    fail_after_steps,
    make_user,
    populate,
)


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_retry_from_a_step_in_a_real_browser(backend, live_server, browser_page, tmp_path):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with executor_on(backend) as service:
        populate(service)
        # In a thread of its own: Playwright's event loop runs in this one, and a handler
        # called where a loop runs gets context.step's awaitable form (docs/durable-tasks.md).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(fail_after_steps, service).result()
        make_user("ops", "view_reliabletask", "operate_reliabletask")
        url = detail_url("t-steps")
        page.goto(f"{live_server.url}/admin/login/?next={url}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{url}")

        steps = page.locator("#re-steps tbody tr")
        assert steps.count() == len(STEPS)
        assert steps.nth(1).locator(".re-step-name").inner_text() == "invoice"
        cut = steps.nth(1).locator(".re-step-result").inner_text()
        assert len(cut) == 80 and cut.endswith("\u2026")
        width = page.viewport_size["width"]
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        # Each row's button on the row's own line, inside the module.
        module = page.locator("#re-steps").bounding_box()
        for index in range(len(STEPS)):
            button = steps.nth(index).locator("button").bounding_box()
            assert button["x"] + button["width"] <= module["x"] + module["width"]
        # From the top: the admin's app sidebar is sticky, so a full-page shot taken scrolled
        # down draws it halfway down the page.
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(shots / "admin-task-steps.png"), full_page=True)

        steps.nth(1).locator("button").click()
        page.wait_for_url(f"**{url}")
        assert "1 task retried from step 'invoice'." in page.locator(".messagelist").inner_text()
        task = service.get_task("t-steps")
        assert task.status is TaskStatus.PENDING
        assert [s.name for s in task.steps] == ["charge"]
        # PENDING: the timeline stays, without its buttons.
        assert page.locator("#re-steps tbody tr").count() == 1
        assert page.locator("#re-steps button").count() == 0
