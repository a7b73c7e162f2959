"""A task's workflow graph in a real browser (headless Chromium at 1280 px, as
test_admin_browser.py): the graph of a 1,000-member batch appears (the time it took is printed,
not asserted), and a failed member is retried from its node. The screenshot goes to pytest's
temporary directory, or to docs/images/ with ``RE_UPDATE_SCREENSHOTS=1``."""

from __future__ import annotations

import concurrent.futures
import os
import time

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import (
    DOCS_IMAGES,
    admin_params,
    detail_url,
    executor_on,
    make_user,
    run_one,
)
from tests.support.contract_support import LEASE

MEMBERS = 1000
QUEUE = "imports"


def import_workflow(service: ReliableExecutor) -> None:
    """An import an operator would meet: an upload, then a fetch with durable steps, then a
    batch of 1,000 rows depending on the fetch (370 done, 12 failed, 18 running, the rest
    waiting) with its report and publish callbacks to come, and an archive after the fetch."""
    service.submit("demo.echo", {"file": "orders-2026-12.csv"}, task_id="import-upload")
    assert run_one(service, "default", "web-1:4242") is TaskStatus.COMPLETED
    service.submit("demo.steps", {}, task_id="import-fetch", depends_on=["import-upload"])
    # In a thread of its own: Playwright's event loop runs in this one (see the steps test).
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(run_one, service, "default", "web-1:4242").result() is (
            TaskStatus.COMPLETED
        )
    service.submit(
        "demo.echo",
        {"keep": "90d"},
        task_id="import-archive",
        queue="archive",
        depends_on=["import-fetch"],
    )
    service.submit_batch(
        [
            TaskSubmitRequest(
                "demo.process_order",
                {"order_id": 5000 + i, "amount": 20.0},
                task_id=f"row-{i:04d}",
                queue=QUEUE,
                depends_on=["import-fetch"],
            )
            for i in range(MEMBERS)
        ],
        batch_id="import-2026-12",
        on_complete=TaskSubmitRequest("demo.echo", {"report": "import"}, task_id="import-report"),
        on_success=TaskSubmitRequest("demo.echo", {"publish": True}, task_id="import-publish"),
    )
    storage = service.storage
    claims = []
    while len(claims) < 400:
        claims += storage.claim("web-2:5150", [QUEUE], 100, LEASE)
    started = [c for c in storage.start_many(claims, LEASE) if c is not None]
    storage.complete_many([(c, {"ok": True}) for c in started[:370]])
    for claim in started[370:382]:
        storage.fail(claim, "PaymentDeclined: card expired", retryable=False)


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_workflow_graph_of_a_big_batch_in_a_real_browser(
    backend, live_server, browser_page, tmp_path
):
    page = browser_page
    shots = DOCS_IMAGES if os.environ.get("RE_UPDATE_SCREENSHOTS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    with executor_on(backend) as service:
        import_workflow(service)
        failed = sorted(t.task_id for t in service.list_tasks(status="FAILED", queue=QUEUE))
        assert len(failed) == 12
        make_user("ops", "view_reliabletask", "operate_reliabletask")
        url = detail_url("import-fetch")
        page.goto(f"{live_server.url}/admin/login/?next={url}")
        page.fill("#id_username", "ops")
        page.fill("#id_password", "pw")
        page.click("input[type=submit]")
        page.wait_for_url(f"**{url}")

        started = time.perf_counter()
        page.goto(f"{live_server.url}{url}")
        page.locator("#re-graph svg.re-graph-svg").wait_for()
        took = time.perf_counter() - started
        timing = page.evaluate(
            "(() => { const n = performance.getEntriesByType('navigation')[0];"
            " return [n.responseStart - n.requestStart, n.responseEnd - n.startTime,"
            " n.domContentLoadedEventEnd - n.startTime, n.transferSize]; })()"
        )
        print(
            f"\n{backend}: the graph of a {MEMBERS}-member batch appeared in {took * 1000:.0f} ms"
            " (server %.0f ms, page received %.0f ms, DOM ready %.0f ms, %d bytes)" % tuple(timing)
        )
        cells = page.locator("#re-graph a.re-gc")
        assert cells.count() == MEMBERS
        assert page.locator('#re-graph a.re-gn[data-id="import-report"]').is_visible()
        legend = page.locator(".re-graph-legend").inner_text()
        assert (
            "12 FAILED" in legend and "18 RUNNING" in legend and "372 COMPLETED" in legend
        )  # with upload, fetch
        width = page.viewport_size["width"]
        assert page.evaluate("document.documentElement.scrollWidth") <= width

        # The status colours come from the SVG's style rules (no fill attribute per cell).
        fill = page.evaluate(
            f'getComputedStyle(document.querySelector(\'#re-graph a[data-id="{failed[0]}"] '
            "rect')).fill"
        )
        assert fill == "rgb(185, 28, 28)"  # #b91c1c, FAILED's badge colour
        # Its tooltip is made when it is first hovered, the name from the cells' group.
        cell = page.locator(f'#re-graph a.re-gn[data-id="{failed[0]}"]')
        assert cell.locator("title").count() == 0
        cell.hover()
        title = cell.locator("title").text_content()
        assert title == f"demo.process_order\n{failed[0]}\nFAILED"
        # A failed member's node: its panel, with Retry now.
        page.locator(f'#re-graph a.re-gn[data-id="{failed[0]}"]').click()
        panel = page.locator("#re-graph-panel")
        assert panel.is_visible()
        assert page.locator("#re-graph-panel-status").inner_text() == "FAILED"
        assert page.locator("#re-graph-panel-id").inner_text() == failed[0]
        assert page.locator("#re-graph-retry").is_visible()
        assert not page.locator("#re-graph-cancel").is_visible()
        page.mouse.move(0, 0)  # no node hovered
        if backend == "default":
            # The graph and its panel, in page coordinates (a full-page clip).
            top, bottom = page.evaluate(
                "[document.getElementById('re-graph'), document.getElementById('re-graph-panel')]"
                ".map((e, i) => e.getBoundingClientRect()[i ? 'bottom' : 'top'] + window.scrollY)"
            )
            page.screenshot(
                path=str(shots / "admin-workflow-graph.png"),
                full_page=True,
                clip={"x": 0, "y": top - 12, "width": width, "height": bottom - top + 24},
            )

        page.click("#re-graph-retry")
        page.wait_for_url(f"**{url}#re-graph")
        message = page.locator("ul.messagelist li")
        assert message.inner_text() == f"Task {failed[0]} retried."
        assert message.locator("a").get_attribute("href") == detail_url(failed[0])
        assert service.get_task(failed[0]).status is TaskStatus.PENDING
        retried = page.locator(f'#re-graph a.re-gn[data-id="{failed[0]}"]')
        assert retried.get_attribute("data-status") == "PENDING"
        page.goto("about:blank")  # the graph reloads no more once the test's data is gone
