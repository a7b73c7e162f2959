"""The workflow around one task, read through the service for its admin page's graph.

Starting at the task shown, the dependencies (``depends_on``) and the dependents
(``executor.dependents_of``) are followed both ways, breadth first; the batch of any task met
brings its members and callbacks (``executor.list_tasks(batch_id=...)``, a page of up to
``READ_PAGE`` a read, or none when its members were all read already as the dependents of a
task), and a batch's callbacks, and what its members depend on, are followed on. Every read is
bounded: at most ``MAX_NODES`` tasks in all, ``MAX_FOLLOWED`` tasks whose dependents are looked
up (one storage read each, of at most ``MAX_NODES`` ids: the rest are counted),
``MAX_BATCHES`` batches; what was left out is said in ``WorkflowGraph.cuts``. The dependents
of a batch's members are not looked up: a 1,000-member batch costs a few reads, not one per
member. The nodes' links cost one ``reverse`` in all (``change_urls``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable
from urllib.parse import quote as quote_url

from django.contrib.admin.utils import quote
from django.utils.http import RFC3986_SUBDELIMS

from ..core.batches import BatchInfo
from ..core.records import TaskInfo
from ..core.states import TaskStatus
from ..service.reliable_executor import ReliableExecutor
from .operations import can_cancel, can_retry
from .task_pages import batch_url, change_url

#: The most tasks a graph holds (the page says when more were left out).
MAX_NODES = 2000
#: The most tasks whose dependents are looked up, one storage read each.
MAX_FOLLOWED = 200
#: The most batches whose members are read.
MAX_BATCHES = 4
#: A batch's members are read this many at a time.
READ_PAGE = 1000

# Edge kinds: a dependency (source must end before target runs), a batch's callback (fired
# once the members ended), a durable wait (``context.wait_for``: target waits for source).
DEPENDS = "depends"
CALLBACK = "callback"
WAITS = "waits"
# Why a task of the graph is not stored.
PURGED = "purged"
NOT_YET = "not submitted yet"  # a callback of a batch not finished
NEVER = "not submitted"  # on_success of a finished batch a member of which did not complete


@dataclasses.dataclass(frozen=True)
class Node:
    """One task of the graph. ``status`` None: not stored, ``absent`` says why (one of
    ABSENT); ``role`` says which callback of its batch it is ("" for other tasks)."""

    task_id: str
    task_name: str
    status: TaskStatus | None
    url: str
    created_at: dt.datetime | None
    batch_id: str | None = None  # the batch whose member it is (not set on callbacks)
    role: str = ""  # "on_complete" or "on_success" for a batch's callback
    can_retry: bool = False
    can_cancel: bool = False
    absent: str = ""

    @property
    def ended(self) -> bool:
        """Terminal, or never to run (purged, or a callback its batch will not submit)."""
        if self.status is None:
            return self.absent != NOT_YET
        return self.status.is_terminal


@dataclasses.dataclass(frozen=True)
class Edge:
    source: str  # a task id, or group_id(batch) for a batch's callback edge
    target: str
    kind: str = DEPENDS


@dataclasses.dataclass(frozen=True)
class Group:
    """A batch drawn as one box: its counters, page and the members read (oldest first)."""

    batch: BatchInfo
    url: str
    members: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class WorkflowGraph:
    focus_id: str
    nodes: dict[str, Node]
    edges: tuple[Edge, ...]
    groups: tuple[Group, ...]
    steps: tuple[str, ...]  # the focus task's durable steps, in the order they finished
    cuts: tuple[str, ...]  # what was left out, in words

    @property
    def live(self) -> bool:
        """Anything still to happen: a task not ended, or a sealed batch not finished."""
        if any(not node.ended for node in self.nodes.values()):
            return True
        return any(g.batch.sealed and not g.batch.finished for g in self.groups)

    @property
    def worth_drawing(self) -> bool:
        """More than the task alone, or its steps."""
        return len(self.nodes) > 1 or bool(self.steps)


def change_urls(site_name: str) -> Callable[[str], str]:
    """``change_url`` for many tasks at the cost of one ``reverse``: the URL of a marker id,
    the marker replaced by each id quoted as ``reverse`` quotes it (2,000 reverses took a
    third of a big graph's time)."""
    marker = "re-graph-marker"
    head, _, tail = change_url(marker, site_name).partition(marker)

    def url(task_id: str) -> str:
        return head + quote_url(quote(task_id), safe=RFC3986_SUBDELIMS + "/~:@") + tail

    return url


def group_id(batch_id: str) -> str:
    """The graph id of a batch's box (no task id holds a space)."""
    return "batch " + batch_id


class _Reader:
    """One graph's reads: the tasks found so far and what was cut."""

    def __init__(self, executor: ReliableExecutor, site_name: str, max_nodes: int) -> None:
        self.executor = executor
        self.site_name = site_name
        self.url = change_urls(site_name)
        self.max_nodes = max_nodes
        self.tasks: dict[str, TaskInfo] = {}
        self.absent: dict[str, str] = {}  # ids not stored -> why (PURGED, NOT_YET, NEVER)
        self.member_of: dict[str, str] = {}
        self.groups: list[Group] = []
        self.cuts: list[str] = []

    def room(self) -> int:
        return self.max_nodes - len(self.tasks) - len(self.absent)

    def fetch(self, ids: Iterable[str]) -> None:
        """Read the tasks among ``ids`` not read yet (one ``get_many``), as room allows."""
        wanted = [i for i in dict.fromkeys(ids) if i not in self.tasks and i not in self.absent]
        if not wanted:
            return
        if len(wanted) > self.room():
            self.cut(f"{len(wanted) - max(self.room(), 0)} related tasks")
            wanted = wanted[: max(self.room(), 0)]
        found = self.executor.storage.get_many(wanted)
        self.tasks.update(found)
        self.absent.update((i, PURGED) for i in wanted if i not in found)

    def cut(self, what: str) -> None:
        self.cuts.append(f"{what} left out (a graph draws at most {self.max_nodes} tasks)")

    def walk(self, focus: TaskInfo) -> None:
        """Breadth first from ``focus``: dependencies, dependents, batches, callbacks. A
        batch's members (but the focus) are drawn, not followed."""
        self.tasks[focus.task_id] = focus
        level = [focus.task_id]
        followed: set[str] = set()
        seen_batches: set[str] = set()
        while level:
            after: list[str] = []
            for task_id in level:
                batch_id = self.tasks[task_id].batch_id if task_id in self.tasks else None
                if batch_id and batch_id not in seen_batches:
                    seen_batches.add(batch_id)
                    after += self.read_batch(batch_id)
            following = [
                t
                for t in level
                if t in self.tasks
                and t not in followed
                and (t == focus.task_id or t not in self.member_of)
            ]
            if len(followed) + len(following) > MAX_FOLLOWED:
                left = following[MAX_FOLLOWED - len(followed) :]
                following = following[: MAX_FOLLOWED - len(followed)]
                self.cuts.append(
                    f"the dependents of {len(left)} tasks not looked up (a graph follows "
                    f"at most {MAX_FOLLOWED} tasks)"
                )
            followed.update(following)
            for task_id in following:
                task = self.tasks[task_id]
                after += task.depends_on
                after += (task.waiting or {}).get("task_ids") or ()
                after += self.dependents(task_id)
            self.fetch(after)
            level = [t for t in dict.fromkeys(after) if t in self.tasks and t not in followed]

    def dependents(self, task_id: str) -> list[str]:
        """Its dependents, as many as a graph draws at most (a task 100,000 wait for costs a
        graph's worth of ids, not all of them); how many more, said in ``cuts``."""
        found = self.executor.dependents_of(task_id, self.max_nodes)
        if len(found) == self.max_nodes:
            rest = self.executor.count_dependents(task_id) - len(found)
            if rest > 0:
                self.cut(f"{rest} of the {rest + len(found)} dependents of task {task_id}")
        return found

    def read_batch(self, batch_id: str) -> list[str]:
        """Read the batch's members and callbacks; returns the ids to follow on: the callbacks,
        and what the members depend on outside the batch."""
        if len(self.groups) >= MAX_BATCHES:
            self.cuts.append(f"batch {batch_id} not read (a graph reads at most {MAX_BATCHES})")
            return []
        batch = self.executor.get_batch(batch_id)
        if batch is None:
            return []
        pairs = ((batch.on_complete_id, "on_complete"), (batch.on_success_id, "on_success"))
        roles = {task_id: role for task_id, role in pairs if task_id}
        members: list[str] = []
        # Every member read already (the dependents of a task they all depend on): only the
        # callbacks are left to read, not the members again.
        read = sum(
            1 for t in self.tasks.values() if t.batch_id == batch_id and t.task_id not in roles
        )
        if read >= batch.total:
            self.fetch(roles)
        else:
            members = self.read_members(batch_id, roles)
        # Members read before (the task shown) belong to the box though the pages missed them.
        listed = set(members)
        members += [
            t.task_id
            for t in self.tasks.values()
            if t.batch_id == batch_id and t.task_id not in roles and t.task_id not in listed
        ]
        for task_id in members:
            self.member_of[task_id] = batch_id
        drawn = tuple(sorted(members, key=lambda m: (self.tasks[m].created_at, m)))
        if batch.total > len(drawn):
            self.cut(f"{batch.total - len(drawn)} of the {batch.total} members of batch {batch_id}")
        for task_id in roles:
            if task_id not in self.tasks:
                self.absent[task_id] = NEVER if batch.finished else NOT_YET
        self.groups.append(Group(batch, batch_url(batch_id, self.site_name), drawn))
        # What the members wait for is followed on too (often one task they all wait for).
        upstream = {d for m in drawn for d in self.tasks[m].depends_on if d not in self.member_of}
        return [*roles, *sorted(upstream)]

    def read_members(self, batch_id: str, roles: dict[str, str]) -> list[str]:
        """The batch's tasks a page at a time, as room allows: the members' ids."""
        members: list[str] = []
        offset = 0
        while True:
            limit = min(READ_PAGE, max(self.room(), 0) + len(roles) + 1)
            page = self.executor.list_tasks(batch_id=batch_id, limit=limit, offset=offset)
            for task in page:
                if task.task_id not in self.tasks and (task.task_id in roles or self.room() > 0):
                    self.tasks[task.task_id] = task
                if task.task_id not in roles and task.task_id in self.tasks:
                    members.append(task.task_id)
            offset += len(page)
            if len(page) < limit or self.room() <= 0:
                return members

    def node(self, task_id: str, roles: dict[str, str]) -> Node:
        url = self.url(task_id)
        task = self.tasks.get(task_id)
        if task is None:
            role = roles.get(task_id, "")
            return Node(task_id, "", None, url, None, role=role, absent=self.absent[task_id])
        return Node(
            task_id,
            task.task_name,
            task.status,
            url,
            task.created_at,
            batch_id=self.member_of.get(task_id),
            role=roles.get(task_id, ""),
            can_retry=can_retry(task.status),
            can_cancel=can_cancel(task.status, task.cancel_requested),
        )

    def edges(self, nodes: dict[str, Node]) -> list[Edge]:
        found: list[Edge] = []
        for task in self.tasks.values():
            found += [Edge(d, task.task_id) for d in task.depends_on if d in nodes]
            waited = (task.waiting or {}).get("task_ids") or ()
            found += [Edge(w, task.task_id, WAITS) for w in waited if w in nodes]
        for group in self.groups:
            for callback in (group.batch.on_complete_id, group.batch.on_success_id):
                if callback in nodes:
                    found.append(Edge(group_id(group.batch.batch_id), callback, CALLBACK))
        return list(dict.fromkeys(found))


def read_graph(
    executor: ReliableExecutor, task: TaskInfo, site_name: str, max_nodes: int = MAX_NODES
) -> WorkflowGraph:
    """The workflow around ``task`` (see the module's docstring for what is read)."""
    reader = _Reader(executor, site_name, max_nodes)
    reader.walk(task)
    roles: dict[str, str] = {}
    for group in reader.groups:
        roles[group.batch.on_complete_id or ""] = "on_complete"
        roles[group.batch.on_success_id or ""] = "on_success"
    ids = [*reader.tasks, *reader.absent]
    nodes = {task_id: reader.node(task_id, roles) for task_id in ids}
    return WorkflowGraph(
        focus_id=task.task_id,
        nodes=nodes,
        edges=tuple(reader.edges(nodes)),
        groups=tuple(reader.groups),
        steps=tuple(step.name for step in task.steps),
        cuts=tuple(reader.cuts),
    )
