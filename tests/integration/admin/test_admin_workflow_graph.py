"""A task page's workflow graph on every storage: the nodes, edges and colours of a chain, a
fan-in and a batch with callbacks; a 1,000-member batch read in a bounded number of storage
round trips; the graph's fragment; retry and cancel from a node for operators only."""

from __future__ import annotations

import contextlib
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.contrib.messages import get_messages
from django.db import connections
from django.template.loader import render_to_string
from django.test.utils import CaptureQueriesContext

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.admin import graph_svg
from django_reliable_executor.admin.graph_views import FRAGMENT
from django_reliable_executor.admin.task_pages import change_url
from django_reliable_executor.admin.workflow_graph import change_urls, read_graph
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import boom, detail_url, run_one
from tests.support.contract_support import HOOKS, claim_and_start

HOOK = "contract.hook"
SVG = "{http://www.w3.org/2000/svg}"
FILL = {status.value: fill for status, fill in graph_svg.STATUS_FILL.items()}
STYLES = Path(graph_svg.__file__).parent.parent / (
    "templates/admin/django_reliable_executor/reliabletask/styles.html"
)


def drawn(html: str) -> tuple[dict[str, tuple[str, str | None]], set[tuple[str, str, str]]]:
    """The page's graph: each task's (status, fill) by id, and its edges (source, target,
    kind), read from the SVG as a browser would (an XML parse of the element)."""
    start = html.index('<svg xmlns="http://www.w3.org/2000/svg" class="re-graph-svg"')
    svg = ET.fromstring(html[start : html.index("</svg>", start) + 6])
    # The fill of a status: the SVG's own style rule for its nodes' rects.
    style = "".join(svg.find(f"{SVG}defs/{SVG}style").itertext())
    fills = dict(re.findall(r'\[data-status="(\w+)"\]>rect\{fill:(#[0-9a-f]{6})\}', style))
    nodes = {}
    for link in svg.iter(SVG + "a"):
        if "re-gn" in (link.get("class") or "").split():
            assert link.find(SVG + "rect") is not None
            status = link.get("data-status")
            nodes[link.get("data-id")] = (status, fills.get(status))
    edges = set()
    for path in svg.iter(SVG + "path"):
        if path.get("data-source"):
            kind = (path.get("class") or "").replace("re-ge", "").strip(" -") or "depends"
            edges.add((path.get("data-source"), path.get("data-target"), kind))
    return nodes, edges


def page(client: Any, task_id: str) -> str:
    response = client.get(detail_url(task_id))
    assert response.status_code == 200
    return response.content.decode()


def request(task_id: str, queue: str = "graph", **options: Any) -> TaskSubmitRequest:
    return TaskSubmitRequest(HOOK, None, task_id=task_id, queue=queue, **options)


def test_the_graph_uses_the_admins_status_colours():
    badges = dict(
        re.findall(r"\.re-status-(\w+) \{ background: (#[0-9a-f]{6}); \}", STYLES.read_text())
    )
    assert {status.lower(): fill for status, fill in FILL.items()} == badges


def test_a_chain_and_a_fan_in(service, viewer):
    service.chain([request("c-order"), request("c-charge"), request("c-email")])
    assert run_one(service, "graph") is TaskStatus.COMPLETED  # c-order
    nodes, edges = drawn(page(viewer, "c-charge"))
    assert nodes == {
        "c-order": ("COMPLETED", FILL["COMPLETED"]),
        "c-charge": ("CREATED", FILL["CREATED"]),
        "c-email": ("CREATED", FILL["CREATED"]),
    }
    assert edges == {("c-order", "c-charge", "depends"), ("c-charge", "c-email", "depends")}
    html = page(viewer, "c-email")
    assert 'class="re-gn re-gn-focus"' in html and 'data-id="c-email"' in html
    assert drawn(html)[1] == edges  # the same chain from its end
    assert 'id="re-graph"' not in page(viewer, "t-created")  # a task alone: no graph

    # A fan-in: three tasks, one of which fails (its dependent is cancelled).
    for task_id in ("f-a", "f-b", "f-c"):
        service.submit_task(request(task_id, queue=task_id, retry_limit=0))
    service.submit_task(request("f-join", depends_on=["f-a", "f-b", "f-c"]))
    HOOKS["f-b"] = boom
    assert run_one(service, "f-a") is TaskStatus.COMPLETED
    assert run_one(service, "f-b") is TaskStatus.FAILED  # f-join is cancelled
    nodes, edges = drawn(page(viewer, "f-a"))
    assert nodes == {
        "f-a": ("COMPLETED", FILL["COMPLETED"]),
        "f-b": ("FAILED", FILL["FAILED"]),
        "f-c": ("CREATED", FILL["CREATED"]),
        "f-join": ("CANCELLED", FILL["CANCELLED"]),
    }
    assert edges == {(d, "f-join", "depends") for d in ("f-a", "f-b", "f-c")}


def test_a_batch_with_callbacks(service, viewer):
    service.submit_task(request("b-src", queue="b-src"))
    assert run_one(service, "b-src") is TaskStatus.COMPLETED
    info = service.submit_batch(
        [request(f"b-{i}", queue=f"b-{i}", depends_on=["b-src"]) for i in range(3)],
        batch_id="b-graph",
        on_complete=request("b-done"),
        on_success=request("b-ok"),
    )
    assert service.cancel_task("b-2")  # so on_success is never submitted
    html = page(viewer, "b-0")
    nodes, edges = drawn(html)
    assert nodes["b-done"] == ("", None) and nodes["b-ok"] == ("", None)
    assert 'data-id="b-done" data-status="" data-name="">' in html  # no action applies
    callbacks = {("batch b-graph", "b-done", "callback"), ("batch b-graph", "b-ok", "callback")}
    sources = {("b-src", f"b-{i}", "depends") for i in range(3)}
    assert edges == callbacks | sources
    assert 'id="re-graph-body" data-live="1"' in html and "2 not submitted yet" in html
    assert [run_one(service, q) for q in ("b-0", "b-1")] == [TaskStatus.COMPLETED] * 2
    assert info.on_complete_id == "b-done"  # submitted now: the last member ended
    html = page(viewer, "b-done")
    nodes, edges = drawn(html)
    assert nodes == {
        "b-src": ("COMPLETED", FILL["COMPLETED"]),
        "b-0": ("COMPLETED", FILL["COMPLETED"]),
        "b-1": ("COMPLETED", FILL["COMPLETED"]),
        "b-2": ("CANCELLED", FILL["CANCELLED"]),
        "b-done": ("CREATED", FILL["CREATED"]),
        "b-ok": ("", None),
    }
    assert edges == callbacks | sources
    # From the task they all depend on: the members come as its dependents, the callbacks
    # with their batch.
    assert drawn(page(viewer, "b-src")) == (nodes, edges)
    assert "1 not submitted</span>" in html and "not submitted yet" not in html


@contextlib.contextmanager
def round_trips(service: ReliableExecutor, backend: str) -> Iterator[list[Any]]:
    """Every SQL query, or every Redis command and pipeline, the storage sends meanwhile."""
    if backend != "redis":
        with CaptureQueriesContext(connections[backend]) as queries:
            trips: list[Any] = []
            yield trips
        trips += queries.captured_queries
        return
    client, sent = service.storage.client, []
    execute, pipeline = client.execute_command, client.pipeline

    def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = pipeline(*args, **kwargs)
        run = pipe.execute
        pipe.execute = lambda *a, **k: (sent.append("pipeline"), run(*a, **k))[1]
        return pipe

    client.execute_command = lambda *a, **k: (sent.append(a[0]), execute(*a, **k))[1]
    client.pipeline = counted_pipeline
    try:
        yield sent
    finally:
        del client.execute_command, client.pipeline


def test_a_batch_of_1000_is_read_in_bounded_round_trips(service, viewer, request):
    backend = request.node.callspec.params["service"]
    trips = {}
    for size in (20, 1000):
        service.submit_batch(
            [request_of(f"m{size}-{i}") for i in range(size)],
            batch_id=f"big-{size}",
            on_complete=request_of(f"m{size}-done"),
        )
        focus = service.get_task(f"m{size}-7")
        with round_trips(service, backend) as sent:
            graph = read_graph(service, focus, "admin")
        trips[size] = len(sent)
        assert len(graph.nodes) == size + 1 and graph.cuts == ()
    # A few more pages of members: nothing is read per member.
    assert trips[1000] <= trips[20] + 10 and trips[1000] <= 25, trips
    started = time.perf_counter()
    html = page(viewer, "m1000-7")
    took = time.perf_counter() - started
    print(f"\n{backend}: 1,000-member batch page built in {took * 1000:.0f} ms, {trips}")
    nodes, edges = drawn(html)
    assert len(nodes) == 1001 and html.count('class="re-gn re-gc') == 1000
    # Small per cell: an <a> and a <rect>, no tooltip, fill or name of its own (the status
    # colours are style rules, the common name is its group's): 312 KB of SVG before.
    start = html.index('<svg xmlns="http://www.w3.org/2000/svg" class="re-graph-svg"')
    svg = html[start : html.index("</svg>", start)]
    print(f"{backend}: the SVG of a 1,000-member batch: {len(svg)} characters")
    assert len(svg) < 230_000 and "<title>" not in svg and " fill=" not in svg
    assert svg.count(' data-name="contract.hook"') == 1  # the cells' group's (callback to come)
    assert edges == {("batch big-1000", "m1000-done", "callback")}
    assert "Batch big-1000 · 1000 members" in html and "0 completed · 0 failed" in html

    # Fewer tasks than the batch holds: the graph is cut, and says so.
    graph = read_graph(service, service.get_task("m20-7"), "admin", max_nodes=10)
    assert "m20-7" in graph.nodes and len(graph.nodes) == 11  # with the callback to come
    cut = "10 of the 20 members of batch big-20 left out (a graph draws at most 10 tasks)"
    assert graph.cuts == (cut,)
    html = render_to_string(FRAGMENT, {"graph": graph_svg.drawing(graph)})
    assert f"The graph is cut: {cut}." in html
    assert "The graph is cut" not in page(viewer, "m20-7")  # 2,000 on the page


def test_a_task_thousands_depend_on_reads_a_graphs_worth_of_them(service, viewer):
    # 30 dependents and a graph of at most 10 tasks: 10 ids are read, the rest counted.
    service.submit_task(request("many-root"))
    service.submit_many([request(f"many-{i:02d}", depends_on=["many-root"]) for i in range(30)])
    graph = read_graph(service, service.get_task("many-root"), "admin", max_nodes=10)
    assert "20 of the 30 dependents of task many-root left out" in graph.cuts[0]
    assert len(graph.nodes) == 10


def test_a_graphs_links_are_the_admins_own():
    # One reverse for all the nodes' links: the same URL as reverse gives each task.
    url = change_urls("admin")
    for task_id in (ODD, "a b", "ü/€", "%2F", "_5F", "x?y#z", "~:@!$&'()*+,;="):
        assert url(task_id) == change_url(task_id), task_id


def request_of(task_id: str) -> TaskSubmitRequest:
    return TaskSubmitRequest(HOOK, None, task_id=task_id, queue="big")


def test_viewer_sees_the_graph_and_its_fragment_without_actions(service, viewer):
    service.chain([request("p-1", retry_limit=0), request("p-2", on_dependency_failure="run")])
    HOOKS["p-1"] = boom
    assert run_one(service, "graph") is TaskStatus.FAILED
    html = page(viewer, "p-2")
    assert 'data-id="p-1"' in html and 'data-actions="retry"' in html
    assert 'id="re-graph-retry"' not in html and 'id="re-graph-cancel"' not in html
    url = detail_url("p-2").replace("/change/", "/graph/")
    assert viewer.post(url, {"action": "retry", "task_id": "p-1"}).status_code == 403
    assert service.get_task("p-1").status is TaskStatus.FAILED

    # The fragment the page reloads: live until every task of the graph has ended.
    service.chain([request("r-1", queue="frag"), request("r-2", queue="frag")])
    url = detail_url("r-1").replace("/change/", "/graph/")
    body = viewer.get(url).content.decode()
    assert '<div id="re-graph-body" data-live="1">' in body
    assert "<svg" in body and "<html" not in body
    assert [run_one(service, "frag") for _ in range(2)] == [TaskStatus.COMPLETED] * 2
    assert 'id="re-graph-body" data-live="0"' in viewer.get(url).content.decode()
    assert viewer.get(url.replace("r-1", "r-none")).status_code == 404


def said(response: Any) -> str:
    """The last message the action left."""
    return [str(m) for m in get_messages(response.wsgi_request)][-1]


def test_operator_retries_and_cancels_from_a_node(service, operator):
    service.chain([request("o-1", retry_limit=0), request("o-2", on_dependency_failure="run")])
    HOOKS["o-1"] = boom
    assert run_one(service, "graph") is TaskStatus.FAILED
    html = page(operator, "o-2")
    assert 'id="re-graph-retry"' in html and 'id="re-graph-cancel"' in html
    url = detail_url("o-2").replace("/change/", "/graph/")
    response = operator.post(url, {"action": "retry", "task_id": "o-1"})
    assert response.status_code == 302 and response.url == detail_url("o-2") + "#re-graph"
    # The message names the task acted on, a link to its page.
    link = f'<a href="{detail_url("o-1")}">o-1</a>'
    assert said(response) == f"Task {link} retried."
    assert service.get_task("o-1").status is TaskStatus.PENDING
    response = operator.post(url, {"action": "cancel", "task_id": "o-2"})
    assert said(response) == f'Task <a href="{detail_url("o-2")}">o-2</a> cancelled.'
    assert service.get_task("o-2").status is TaskStatus.CANCELLED
    # A refusal names the task too, and says why.
    response = operator.post(url, {"action": "cancel", "task_id": "o-2"})
    assert said(response) == (
        f'Task <a href="{detail_url("o-2")}">o-2</a> not cancelled: CANCELLED cannot be cancelled.'
    )
    response = operator.post(url, {"action": "cancel", "task_id": ""})
    assert said(response) == "Choose a task of the graph first: nothing was changed."
    assert service.get_task("o-1").status is TaskStatus.PENDING


def test_a_refused_retry_from_a_node_says_where_the_handler_still_runs(service, operator):
    service.submit("demo.echo", None, task_id="late", max_duration_millis=1, queue="late")
    service.submit("demo.echo", None, task_id="after", depends_on=["late"])
    claim_and_start(service.storage, "w-late", "late")
    time.sleep(0.01)
    assert [t.task.task_id for t in service.storage.expire_overdue(10)] == ["late"]
    url = detail_url("after").replace("/change/", "/graph/")
    response = operator.post(url, {"action": "retry", "task_id": "late"})
    message = said(response)
    assert message.startswith(f'Task <a href="{detail_url("late")}">late</a> not retried: ')
    assert "its previous attempt is still running on worker w-late" in message
    assert service.get_task("late").status is TaskStatus.TIMEOUT
    response = operator.post(url, {"action": "retry", "task_id": "gone"})
    assert said(response) == f'Task <a href="{detail_url("gone")}">gone</a> not retried: not found.'


ODD = "q\"'<script>alert(1)</script>/ü_1%2F&amp;"


def test_odd_ids_are_escaped_in_the_svg_and_their_links_work(service, operator):
    # Quotes, markup, a slash, unicode, "%2F" and an entity in the ids of a task, its
    # dependent and its batch: text and attributes escaped (the SVG parses, no script), every
    # node's link and the graph's URL open that task, and a node's cancel acts on that task.
    service.submit_batch([request(ODD)], batch_id=ODD + "b", on_complete=request(ODD + "cb"))
    service.submit_task(request(ODD + "dep", depends_on=[ODD]))
    for focus in (ODD, ODD + "dep"):
        html = page(operator, focus)
        assert "<script>alert(1)" not in html
        nodes, edges = drawn(html)  # parses: every attribute and text escaped
        assert {ODD, ODD + "dep", ODD + "cb"} <= set(nodes)
        assert (ODD, ODD + "dep", "depends") in edges
    svg = html[html.index("<svg") : html.index("</svg>")]
    for href in set(re.findall(r'<a class="re-gn[^"]*" href="([^"]+)"', svg)):
        task_page = operator.get(href.replace("&amp;", "&"))
        assert task_page.status_code == 200, href
    url = detail_url(ODD).replace("/change/", "/graph/")
    assert operator.get(url).status_code == 200
    response = operator.post(url, {"action": "cancel", "task_id": ODD + "dep"})
    assert response.status_code == 302 and response.url == detail_url(ODD) + "#re-graph"
    assert service.get_task(ODD + "dep").status is TaskStatus.CANCELLED
    # A node id of no task: said, nothing changed.
    response = operator.post(url, {"action": "cancel", "task_id": "no-such-task"})
    assert response.status_code == 302
    assert service.get_task(ODD).status is TaskStatus.CREATED
