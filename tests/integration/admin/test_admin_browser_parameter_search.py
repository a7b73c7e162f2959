"""Search the task list by tag and parameter in a real browser (Chromium through Playwright), on
SQLite and Redis: the terms typed become the list's filters and the box shows them again."""

from __future__ import annotations

import pytest

from tests.support.admin_support import LIST_PATH, admin_params, executor_on, make_user


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_search_by_tag_and_parameter_in_a_real_browser(backend, live_server, browser_page):
    page = browser_page
    with executor_on(backend) as service:
        service.submit("demo.echo", {"customer_id": 42}, task_id="c42-import", tags=["import"])
        service.submit("demo.echo", {"customer_id": 42}, task_id="c42-plain")
        service.submit("demo.echo", {"customer_id": "42"}, task_id="c42-text", tags=["import"])
        service.submit("demo.echo", {"customer_id": 7}, task_id="c7-import", tags=["import"])
        make_user("viewer", "view_reliabletask")
        page.goto(f"{live_server.url}/admin/login/?next={LIST_PATH}")
        page.fill("#id_username", "viewer")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{LIST_PATH}")

        page.fill("#searchbar", "customer_id=42 tag:import")
        page.press("#searchbar", "Enter")
        page.wait_for_url("**parameter=*")
        rows = page.locator("#result_list tbody tr")
        assert rows.count() == 1
        assert "c42-import" in rows.first.inner_text()
        assert page.input_value("#searchbar") == "tag:import customer_id=42"

        page.fill("#searchbar", 'customer_id="42"')  # the string, not the number
        page.press("#searchbar", "Enter")
        page.wait_for_selector("#result_list >> text=c42-text")
        assert page.locator("#result_list tbody tr").count() == 1

        page.fill("#searchbar", "customer_id=42 oops")
        page.press("#searchbar", "Enter")
        page.wait_for_selector(".messagelist")
        assert "Could not read 'oops'" in page.locator(".messagelist").inner_text()
