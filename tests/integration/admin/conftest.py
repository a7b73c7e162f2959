"""The admin tests' fixtures: the module executor on each storage holding the POPULATED tasks
(``service``), a viewer and an operator logged in, and the browser page of the Playwright tests."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.admin_support import (
    CHROMIUM,
    admin_params,
    executor_on,
    make_user,
    populate,
    require_browser,
)


@pytest.fixture(params=admin_params())
def service(request: pytest.FixtureRequest):
    """The module executor on the backend under test, holding the POPULATED tasks."""
    with executor_on(request.param) as service:
        populate(service)
        yield service


@pytest.fixture
def viewer(client):
    client.force_login(make_user("viewer", "view_reliabletask"))
    return client


@pytest.fixture
def operator(client):
    client.force_login(make_user("operator", "view_reliabletask", "operate_reliabletask"))
    return client


@pytest.fixture
def browser_page(monkeypatch: pytest.MonkeyPatch) -> Any:
    sync_playwright = require_browser()
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            # A laptop's width, the admin as a new user first sees it (its app sidebar open
            # where a page has one): every column of the list must fit beside the filters.
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()
