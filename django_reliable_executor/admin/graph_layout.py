"""Where each task of a workflow graph goes: a deterministic layered layout, top to bottom.

Each task is a unit, and so is each batch (a box holding its members): a unit's row is the
longest path of edges leading to it (a task runs after everything above it), and a row's units
are ordered by submission, wrapped onto more lines past ``MAX_WIDTH`` (a fan-in of 50 stays
within the page). A batch of up to ``SMALL_BATCH`` members shows each member as a node; a
larger one shows them as a grid of small cells, ``GRID_COLUMNS`` a row, so a batch of 1,000
members stays one readable box (and one cheap loop). Pure: no I/O, no markup.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections import defaultdict

from .workflow_graph import Edge, Group, WorkflowGraph, group_id

NODE_W, NODE_H = 212, 42
GAP, LINE_GAP, LAYER_GAP = 20, 16, 44  # between units of a line, lines of a row, rows
ROW_GAP = 12  # between the nodes stacked in a small batch's box
MARGIN = 12
MAX_WIDTH = 860  # a row wider than this wraps (what the task page has beside the admin's menu)
SMALL_BATCH = 12
GRID_COLUMNS = 40
CELL, CELL_GAP = 11, 2
PAD, HEAD = 10, 40  # a batch box's padding, and its heading's height (id, counts)
MIN_GROUP_W = 300  # room for the heading
LATEST = dt.datetime.max.replace(tzinfo=dt.timezone.utc)


@dataclasses.dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float

    @property
    def bottom(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y + self.h

    @property
    def top(self) -> tuple[float, float]:
        return self.x + self.w / 2, self.y


@dataclasses.dataclass
class Unit:
    """A task, or a batch's box (``group`` set; ``grid``: its members as cells)."""

    uid: str
    key: tuple[dt.datetime, int, str]  # submitted, then on_complete before on_success
    w: float = NODE_W
    h: float = NODE_H
    group: Group | None = None
    grid: bool = False
    layer: int = 0
    box: Box = Box(0, 0, 0, 0)


@dataclasses.dataclass(frozen=True)
class Layout:
    width: float
    height: float
    units: list[Unit]
    nodes: dict[str, Box]  # each task drawn as a node (not a cell): its box
    cells: dict[str, Box]  # each member drawn as a cell of its batch's grid
    edges: list[tuple[Box, Box, Edge]]  # from a box's bottom to another's top


def _units(graph: WorkflowGraph) -> tuple[dict[str, Unit], dict[str, str]]:
    """The units by id, and the unit of each task id (and of each batch's box id)."""
    units: dict[str, Unit] = {}
    unit_of: dict[str, str] = {}
    for group in graph.groups:
        uid = group_id(group.batch.batch_id)
        created = [graph.nodes[m].created_at or LATEST for m in group.members]
        unit = Unit(uid, (min(created, default=group.batch.created_at), 0, uid), group=group)
        n = len(group.members)
        if n > SMALL_BATCH:
            cols = min(n, GRID_COLUMNS)
            rows = math.ceil(n / cols)
            unit.grid = True
            unit.w = max(cols * (CELL + CELL_GAP) - CELL_GAP + 2 * PAD, MIN_GROUP_W)
            unit.h = HEAD + rows * (CELL + CELL_GAP) - CELL_GAP + PAD
        else:
            unit.w = max(NODE_W + 2 * PAD, MIN_GROUP_W)
            unit.h = HEAD + n * (NODE_H + ROW_GAP) - ROW_GAP * (n > 0) + PAD
        units[uid] = unit
        unit_of[uid] = uid
        unit_of.update((m, uid) for m in group.members)
    for task_id, node in graph.nodes.items():
        if task_id not in unit_of:
            rank = ("", "on_complete", "on_success").index(node.role)
            units[task_id] = Unit(task_id, (node.created_at or LATEST, rank, task_id))
            unit_of[task_id] = task_id
    return units, unit_of


def _layer(units: dict[str, Unit], links: set[tuple[str, str]]) -> None:
    """Longest-path layering (Kahn's order); units on a cycle keep the layer reached so far."""
    after: dict[str, list[str]] = defaultdict(list)
    indegree = dict.fromkeys(units, 0)
    for source, target in sorted(links):
        after[source].append(target)
        indegree[target] += 1
    ready = sorted((u for u, n in indegree.items() if n == 0), key=lambda u: units[u].key)
    while ready:
        uid = ready.pop(0)
        for target in after[uid]:
            units[target].layer = max(units[target].layer, units[uid].layer + 1)
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)


def _lines(column: list[Unit]) -> list[list[Unit]]:
    """A row's units in submission order, on as many lines as MAX_WIDTH needs."""
    lines: list[list[Unit]] = [[]]
    width = 0.0
    for unit in sorted(column, key=lambda u: u.key):
        if lines[-1] and width + GAP + unit.w > MAX_WIDTH:
            lines.append([])
            width = 0.0
        width += (GAP if lines[-1] else 0) + unit.w
        lines[-1].append(unit)
    return lines


def _place(units: dict[str, Unit]) -> tuple[float, float]:
    """Rows top to bottom, each line centred on the widest; returns the drawing's size."""
    rows: dict[int, list[Unit]] = defaultdict(list)
    for unit in units.values():
        rows[unit.layer].append(unit)
    lines = [_lines(rows[layer]) for layer in sorted(rows)]

    def line_width(line: list[Unit]) -> float:
        return sum(u.w for u in line) + GAP * (len(line) - 1)

    widest = max((line_width(line) for row in lines for line in row), default=0)
    y: float = MARGIN
    for row in lines:
        for line in row:
            x = MARGIN + (widest - line_width(line)) / 2
            height = max(u.h for u in line)
            for unit in line:  # tops aligned: an arrow to a short unit crosses no tall one
                unit.box = Box(x, y, unit.w, unit.h)
                x += unit.w + GAP
            y += height + LINE_GAP
        y += LAYER_GAP - LINE_GAP
    return widest + 2 * MARGIN, y - LAYER_GAP + MARGIN


def _members(unit: Unit, nodes: dict[str, Box], cells: dict[str, Box]) -> None:
    """The boxes of a batch's members inside its box: nodes stacked, or a grid of cells."""
    assert unit.group is not None
    box = unit.box
    for index, member in enumerate(unit.group.members):
        if unit.grid:
            row, col = divmod(index, GRID_COLUMNS)
            step = CELL + CELL_GAP
            cells[member] = Box(box.x + PAD + col * step, box.y + HEAD + row * step, CELL, CELL)
        else:
            y = box.y + HEAD + index * (NODE_H + ROW_GAP)
            nodes[member] = Box(box.x + (box.w - NODE_W) / 2, y, NODE_W, NODE_H)


def layout(graph: WorkflowGraph) -> Layout:
    """Place every task and batch of ``graph``, and route each edge between two boxes (an edge
    of a member drawn as a cell starts or ends at its batch's box; one inside a batch, which
    would run within the box, is left out)."""
    units, unit_of = _units(graph)
    links = {(unit_of[e.source], unit_of[e.target]) for e in graph.edges}
    links = {(s, t) for s, t in links if s != t}
    _layer(units, links)
    width, height = _place(units)
    nodes: dict[str, Box] = {}
    cells: dict[str, Box] = {}
    for unit in units.values():
        if unit.group is None:
            nodes[unit.uid] = unit.box
        else:
            _members(unit, nodes, cells)
    routed: dict[tuple[Box, Box], Edge] = {}  # many cells' edges to one task: one arrow
    for edge in graph.edges:
        source, target = unit_of[edge.source], unit_of[edge.target]
        if source == target:
            continue
        start = nodes.get(edge.source) or units[source].box
        end = nodes.get(edge.target) or units[target].box
        routed.setdefault((start, end), edge)
    ordered = sorted(units.values(), key=lambda u: (u.layer, u.key))
    return Layout(width, height, ordered, nodes, cells, [(s, e, x) for (s, e), x in routed.items()])
