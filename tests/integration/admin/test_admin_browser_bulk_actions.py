"""A bulk retry of 50,000 dead letters in a real browser (Chromium through Playwright) on
SQLite, run by a real ``runexecutor``: the operator opens "Retry all matching", sees the total,
confirms with a double click, and watches the count reach 50,000; each task is retried once.
Its screenshots (the confirmation, the progress) go to pytest's temporary directory, or to
docs/images/ with ``RE_UPDATE_SCREENSHOTS=1``."""

from __future__ import annotations

import os
import time
from urllib.parse import quote

import pytest
from django.db import connections

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.bulk_walk import BULK_ACTION
from tests.support.admin_support import (
    DOCS_IMAGES,
    LIST_PATH,
    admin_params,
    executor_on,
    make_user,
)
from tests.support.processes import Backend

DEAD_LETTERS = 50_000
SUBMIT_CHUNK = 5_000


def fill_dead_letters(service, n: int) -> None:
    """``n`` tasks of queue "invoices" stored by submit_many, then ended FAILED by one UPDATE
    (as a first attempt that raised would leave them): fast enough for 50,000."""
    for first in range(0, n, SUBMIT_CHUNK):
        service.submit_many(
            [
                TaskSubmitRequest(
                    "demo.echo", {"invoice": i}, task_id=f"inv-{i:05d}", queue="invoices"
                )
                for i in range(first, min(n, first + SUBMIT_CHUNK))
            ]
        )
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "UPDATE reliable_executor_task SET status = 'FAILED', available = 0, attempts = 1, "
            "budget_attempts = 1, started_at = created_at, finished_at = created_at, "
            "last_error = 'RuntimeError: upstream down' WHERE queue = 'invoices'"
        )


@pytest.mark.parametrize("backend", admin_params(["default"]))
def test_retry_all_dead_letters_of_a_queue_in_a_real_browser(
    backend, live_server, browser_page, workers, tmp_path
):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    started = time.monotonic()
    with executor_on(backend) as service:
        fill_dead_letters(service, DEAD_LETTERS)
        filled = time.monotonic()
        make_user("ops", "view_reliabletask", "operate_reliabletask")
        list_url = f"{LIST_PATH}?status=dead&queue=invoices"
        page.goto(f"{live_server.url}/admin/login/?next={quote(list_url)}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url("**queue=invoices**")

        page.click("#re-bulk-retry")
        total = page.locator("#re-bulk-total")
        assert total.locator("strong").first.inner_text() == "50,000"
        assert "status=dead letters (FAILED, TIMEOUT, ERROR), queue=invoices" in total.inner_text()
        page.screenshot(path=str(shots / "admin-bulk-confirm.png"), full_page=True)
        page.dblclick("#re-bulk-confirm")  # a double click: two posts of one confirmation
        page.wait_for_selector("#re-bulk-waits")
        assert "no worker is running" in page.locator("#re-bulk-waits").inner_text()
        bulk = service.list_tasks(task_name=BULK_ACTION)
        assert len(bulk) == 1, [t.task_id for t in bulk]

        workers.start(Backend("default", ""), "--queues", "default")
        # The page reloads itself: the count moves, then reaches the total.
        page.wait_for_function(
            "() => { const c = document.querySelector('#re-bulk-count');"
            " return c && +c.dataset.examined > 0 && +c.dataset.examined < 50000; }",
            timeout=60_000,
        )
        page.screenshot(path=str(shots / "admin-bulk-progress.png"), full_page=True)
        page.wait_for_selector("#re-bulk-changed", timeout=900_000)
        walked = time.monotonic()
        assert page.locator("#re-bulk-count").inner_text() == "50,000 / 50,000"
        assert page.locator("#re-bulk-changed").inner_text() == "50,000"
        assert page.locator("#re-bulk-skipped").inner_text() == "none"

        counts = service.count_by_status("invoices")
        assert counts[TaskStatus.PENDING] == DEAD_LETTERS, counts
        assert service.list_tasks(task_name=BULK_ACTION)[0].result["changed"] == DEAD_LETTERS
        assert len(service.list_tasks(task_name=BULK_ACTION)) == 1
    print(
        f"\nfilled {DEAD_LETTERS} in {filled - started:.1f} s, walked in "
        f"{walked - filled:.1f} s, test {time.monotonic() - started:.1f} s"
    )
