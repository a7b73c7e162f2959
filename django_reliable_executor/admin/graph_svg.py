"""A workflow graph drawn as inline SVG (no script library, no build step): nodes coloured by
status, each a link to its task's page, edges as arrows, a big batch as a grid of cells.

Every task's ``<a>`` carries ``data-id``, ``data-status``, ``data-name`` (a batch's cells take
it from their ``<g>`` when it is the batch's common task name) and ``data-actions`` (what the
admin's retry and cancel would accept, left out when none): the page's script shows them, and
the operator's retry and cancel forms, in a panel when a node is clicked, and makes a node's
tooltip when it is first hovered. Kept small for a graph of 2,000 tasks: the status colours are
one ``<style>`` rule each (``[data-status]``), not an attribute per node, and a cell is an
``<a>`` and a ``<rect>`` (the page of a 1,000-member batch's graph: 312 KB of SVG and 3,609
elements before, 202 KB and 2,606 now).
"""

from __future__ import annotations

from collections import Counter
from html import escape
from typing import Any

from django.utils.safestring import SafeString, mark_safe

from ..core.states import TaskStatus
from .graph_layout import CELL, MARGIN, PAD, Box, Layout, Unit, layout
from .workflow_graph import DEPENDS, NEVER, NOT_YET, PURGED, WAITS, Node, WorkflowGraph

# The admin's status colours: the backgrounds of styles.html's .re-status-* badges (a test
# holds the two together).
STATUS_FILL = {
    TaskStatus.CREATED: "#64748b",
    TaskStatus.PENDING: "#b45309",
    TaskStatus.RUNNING: "#1d4ed8",
    TaskStatus.COMPLETED: "#15803d",
    TaskStatus.FAILED: "#b91c1c",
    TaskStatus.ERROR: "#7e22ce",
    TaskStatus.TIMEOUT: "#c2410c",
    TaskStatus.CANCELLED: "#52525b",
}
NAME_CHARS = 27  # what fits a node's width at the node's font size
ID_CHARS = 20
STEP_CHAR_W, STEP_H, STEP_GAP = 7.2, 24, 26  # the steps strip's pills


def short_id(task_id: str) -> str:
    """The id, or its start and end around "…" when longer than ID_CHARS."""
    if len(task_id) <= ID_CHARS:
        return task_id
    return task_id[:11] + "\u2026" + task_id[-6:]


def short_name(name: str) -> str:
    """The task name, or its end after "…" (the handler's own name is at the end)."""
    return name if len(name) <= NAME_CHARS else "\u2026" + name[-(NAME_CHARS - 1) :]


def _n(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _attrs(**values: Any) -> str:
    return " ".join(
        f'{k.rstrip("_").replace("_", "-")}="{escape(str(v))}"'
        for k, v in values.items()
        if v is not None
    )


def _state(node: Node) -> str:
    return node.status.value if node.status is not None else node.absent


def _link(node: Node, css: str, name: str | None) -> str:
    """A task's ``<a>`` opening tag; ``name`` None: its ``data-name`` comes from its ``<g>``."""
    allowed = (("retry", node.can_retry), ("cancel", node.can_cancel))
    actions = " ".join(action for action, ok in allowed if ok) or None
    tag = _attrs(
        class_=css,
        href=node.url,
        data_id=node.task_id,
        data_status=node.status.value if node.status else "",
        data_name=name,
        data_actions=actions,
    )
    return f"<a {tag}>"


def _node(node: Node, box: Box, focus: bool) -> str:
    css = "re-gn" + (" re-gn-focus" if focus else "") + ("" if node.status else " re-gn-absent")
    parts = [_link(node, css, node.task_name)]
    if focus:
        ring = _attrs(x=_n(box.x - 4), y=_n(box.y - 4), width=_n(box.w + 8), height=_n(box.h + 8))
        parts.append(f'<rect class="re-gn-ring" {ring} rx="9"/>')
    rect = _attrs(x=_n(box.x), y=_n(box.y), width=_n(box.w), height=_n(box.h))
    parts.append(f'<rect {rect} rx="6"/>')
    name = short_name(": ".join(t for t in (node.role, node.task_name) if t) or "task")
    sub = f"{short_id(node.task_id)} \u00b7 {_state(node)}"
    x = _n(box.x + 10)
    parts.append(f'<text class="re-gn-name" x="{x}" y="{_n(box.y + 17)}">{escape(name)}</text>')
    parts.append(f'<text class="re-gn-sub" x="{x}" y="{_n(box.y + 33)}">{escape(sub)}</text>')
    return "".join(parts) + "</a>"


def _cells(graph: WorkflowGraph, cells: list[tuple[str, Box]]) -> str:
    """A batch's members drawn as cells, in a ``<g>`` holding their common task name."""
    common = Counter(graph.nodes[t].task_name for t, _ in cells).most_common(1)[0][0]
    parts = [f"<g {_attrs(class_='re-gcs', data_name=common)}>"]
    for task_id, box in cells:
        node = graph.nodes[task_id]
        css = "re-gn re-gc" + (" re-gn-focus" if task_id == graph.focus_id else "")
        name = None if node.task_name == common else node.task_name
        parts.append(
            f'{_link(node, css, name)}<rect x="{_n(box.x)}" y="{_n(box.y)}" width="{CELL}" '
            f'height="{CELL}"/></a>'
        )
    return "".join(parts) + "</g>"


def _group(unit: Unit) -> str:
    assert unit.group is not None
    batch, box = unit.group.batch, unit.box
    frame = _attrs(x=_n(box.x), y=_n(box.y), width=_n(box.w), height=_n(box.h))
    title = f"Batch {short_id(batch.batch_id)} \u00b7 {batch.total} member" + (
        "s" if batch.total != 1 else ""
    )
    counts = (
        f"{batch.completed} completed \u00b7 {batch.failed} failed \u00b7 {batch.cancelled}"
        f" cancelled \u00b7 {batch.pending} pending{' (finished)' if batch.finished else ''}"
    )
    x = _n(box.x + PAD)
    return (
        f'<g class="re-gg" {_attrs(data_batch=batch.batch_id)}>'
        f'<rect class="re-gg-frame" {frame} rx="8"/>'
        f'<a href="{escape(unit.group.url)}"><text class="re-gg-title" x="{x}" '
        f'y="{_n(box.y + 17)}">{escape(title)}</text></a>'
        f'<text class="re-gg-counts" x="{x}" y="{_n(box.y + 32)}">{escape(counts)}</text></g>'
    )


def _edge(start: Box, end: Box, kind: str, source: str, target: str) -> str:
    (x1, y1), (x2, y2) = start.bottom, end.top
    bend = max((y2 - y1) / 2, 24)
    points = (x1, y1 + bend, x2, y2 - bend, x2, y2 - 2)
    d = f"M{_n(x1)} {_n(y1)} C" + " ".join(_n(p) for p in points)
    css = "re-ge" + {DEPENDS: "", WAITS: " re-ge-waits"}.get(kind, " re-ge-callback")
    attrs = _attrs(class_=css, d=d, data_source=source, data_target=target)
    return f'<path {attrs} marker-end="url(#re-arrow)"/>'


def _steps(steps: tuple[str, ...], top: float) -> tuple[str, float]:
    """The focus task's durable steps as a row of pills joined by arrows, each a link to the
    page's steps table; returns the markup and the row's right edge."""
    label = "Its durable steps:"
    parts = [f'<text class="re-gl" x="{MARGIN}" y="{_n(top + 16)}">{label}</text>']
    x = MARGIN + len(label) * STEP_CHAR_W + 8
    fill = STATUS_FILL[TaskStatus.COMPLETED]
    for index, name in enumerate(steps):
        width = len(name) * STEP_CHAR_W + 20
        if index:
            mid = _n(top + STEP_H / 2)
            parts.append(
                f'<path class="re-ge" d="M{_n(x - STEP_GAP + 2)} {mid} H{_n(x - 2)}" '
                'marker-end="url(#re-arrow)"/>'
            )
        rect = _attrs(x=_n(x), y=_n(top), width=_n(width), height=STEP_H, fill=fill)
        parts.append(
            f'<a class="re-gstep" href="#re-steps"><title>step {escape(name)}: checkpoint '
            f'stored</title><rect {rect} rx="12"/><text class="re-gn-name" x="{_n(x + 10)}" '
            f'y="{_n(top + 16)}">{escape(name)}</text></a>'
        )
        x += width + STEP_GAP
    return "".join(parts), x


def status_rules() -> str:
    """The status colours as CSS rules: a node's or cell's rect filled by its ``data-status``."""
    return "".join(
        f'.re-graph-svg [data-status="{status.value}"]>rect{{fill:{fill}}}'
        for status, fill in STATUS_FILL.items()
    )


def svg(graph: WorkflowGraph, placed: Layout | None = None) -> SafeString:
    """The graph's ``<svg>`` element (every text escaped)."""
    placed = placed or layout(graph)
    body = [_group(u) for u in placed.units if u.group is not None]
    body += [
        _edge(start, end, edge.kind, edge.source, edge.target) for start, end, edge in placed.edges
    ]
    for task_id, box in placed.nodes.items():
        body.append(_node(graph.nodes[task_id], box, task_id == graph.focus_id))
    for unit in placed.units:
        if unit.grid and unit.group is not None:
            members = [(m, placed.cells[m]) for m in unit.group.members if m in placed.cells]
            body.append(_cells(graph, members) if members else "")
    width, height = placed.width, placed.height
    if graph.steps:
        strip, right = _steps(graph.steps, height)
        body.append(strip)
        width, height = max(width, right + MARGIN), height + STEP_H + MARGIN
    size = _attrs(width=_n(width), height=_n(height), viewBox=f"0 0 {_n(width)} {_n(height)}")
    defs = (
        f"<defs><style>{status_rules()}</style>"
        '<marker id="re-arrow" viewBox="0 0 10 10" refX="8" refY="5" markerWidth="9" '
        'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto">'
        '<path class="re-ge-head" d="M0 0L10 5L0 10z"/></marker>'
        "</defs>"
    )
    head = f'<svg xmlns="http://www.w3.org/2000/svg" class="re-graph-svg" {size} role="group"'
    label = f"Workflow of task {graph.focus_id}: {len(graph.nodes)} tasks"
    return mark_safe(  # noqa: S308 - every value above is escaped
        f'{head} aria-label="{escape(label)}">{defs}{"".join(body)}</svg>'
    )


def drawing(graph: WorkflowGraph) -> dict[str, Any]:
    """The template context of the graph's fragment: the SVG, a legend of the statuses
    drawn with their counts, what was left out, and whether it should refresh."""
    counts = Counter(_state(node) for node in graph.nodes.values())
    legend: list[dict[str, Any]] = [
        {"label": status.value, "count": counts[status.value], "fill": fill}
        for status, fill in STATUS_FILL.items()
        if counts[status.value]
    ]
    legend += [
        {"label": label, "count": counts[label], "fill": None}
        for label in (NOT_YET, NEVER, PURGED)
        if counts[label]
    ]
    return {
        "svg": svg(graph),
        "legend": legend,
        "cuts": graph.cuts,
        "live": graph.live,
        "total": len(graph.nodes),
    }
