"""A task's concurrency key in a real browser (1280 px): under its name in the list, which still
fits beside the filters with a long key, and on its page; panel headers as written (sentence
case), captions included. On SQLite and on Redis storage."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.admin.test_admin_browser import assert_filter_beside_the_list
from tests.support.admin_support import LIST_PATH, admin_params, executor_on, make_user, showcase

LONG_KEY = "tenant:" + "acme-international-holdings-" * 3 + "42"


def log_in(page: Any, live_server: Any) -> None:
    page.goto(f"{live_server.url}/admin/login/?next={LIST_PATH}")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{LIST_PATH}")


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_the_concurrency_key_in_the_list_and_on_the_task_page(
    backend, live_server, browser_page, tmp_path
):
    page = browser_page
    with executor_on(backend) as service:
        showcase(service)
        service.submit("demo.fair_keyed", {}, task_id="keyed-long", concurrency_key=LONG_KEY)
        service.submit("demo.keyed", {}, task_id="keyed-short", concurrency_key="customer:7")
        make_user("ops", "view_reliabletask", "operate_reliabletask")
        log_in(page, live_server)

        row = page.locator('#result_list tr[data-task-id="keyed-long"]')
        assert f"key {LONG_KEY}" in row.locator("td.re-name").inner_text()
        assert "key customer:7" in page.locator('tr[data-task-id="keyed-short"]').inner_text()
        assert_filter_beside_the_list(page)
        # Captions read as written, like the panels' h2 headers beside them.
        assert (
            page.locator("#re-counts caption").inner_text().startswith("Tasks by queue and status")
        )
        assert page.locator("#re-workers h2").inner_text() == "Workers"
        page.screenshot(path=str(tmp_path / f"keys-list-{backend}.png"), full_page=True)

        page.get_by_role("link", name="keyed-long").click()
        page.wait_for_url("**/keyed-long/change/")
        shown = page.locator("#re-concurrency-key td").inner_text()
        assert shown.startswith(LONG_KEY), shown
        assert "at most 2 tasks of this name and key run at once; the keys take turns" in shown
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        page.screenshot(path=str(tmp_path / f"keys-detail-{backend}.png"), full_page=True)
        print(f"screenshots: {tmp_path}")
