"""A running task's "Show stack" in a real browser (headless Chromium at 1280 px, as
test_admin_browser.py), against a real worker: the page's script asks the worker, polls, and
shows the handler's ``time.sleep`` frame within 2 s. The screenshot goes to pytest's temporary
directory, or to docs/images/ with ``RE_UPDATE_SCREENSHOTS=1``."""

from __future__ import annotations

import os
import time

import pytest

from tests.support.admin_support import (
    DOCS_IMAGES,
    admin_params,
    detail_url,
    executor_on,
    make_user,
)
from tests.support.processes import LEASE, Backend
from tests.support.stacks_support import running_record


@pytest.mark.parametrize("backend", admin_params(["default"]))
def test_show_stack_in_a_real_browser(backend, live_server, browser_page, workers, tmp_path):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        workers.start(where, lease_timeout=LEASE)
        task_id = running_record(service, where, workers, attempt_timeout=30)
        make_user("viewer", "view_reliabletask")
        url = detail_url(task_id)
        page.goto(f"{live_server.url}/admin/login/?next={url}")
        page.fill("#id_username", "viewer")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{url}")

        began = time.monotonic()
        page.click("#re-show-stack")
        stack = page.locator("#re-stack-text")
        stack.wait_for(state="visible", timeout=2_000)
        assert time.monotonic() - began < 2.0
        text = stack.inner_text()
        assert "time.sleep(seconds)" in text and ", in record" in text, text
        facts = page.locator("#re-stack-facts").inner_text()
        assert "Running for" in facts and "Attempt timeout" in facts and "left" in facts
        width = page.viewport_size["width"]
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        # From the top: the admin's app sidebar is sticky, so a full-page shot taken scrolled
        # down draws it halfway down the page.
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(shots / "admin-task-stack.png"), full_page=True)
