"""One chunk of a bulk action's walk: the tasks of a filter, newest first, retried or cancelled
one at a time through the service's own compare-and-set, each visited at most once.

The walk reads ``list_tasks`` pages (the same filters as the admin's list) and keeps a cursor:
the creation time of the last task it acted on, with the ids it handled at that exact time.
A task not older than the cursor was handled already (or was submitted after the total was
counted, ``until``), so it is never acted on twice in one walk, whatever moves meanwhile.
Pages are read by offset, and the offset follows what the action does: a dead letter retried
leaves a "dead letters" filter, so the next page starts that much earlier. When tasks before
the offset left the filter for another reason (a worker, another operator), the first task of
the page read is one not handled yet: the walk steps back until it meets a handled one, so no
task is skipped. Tasks submitted meanwhile arrive before the offset and are read again but
not acted on (newest first)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.parameter_filter import cut_short
from ..core.records import TaskInfo
from ..core.states import RETRYABLE_BY_HAND, WAITING_STATUSES, TaskStatus

if TYPE_CHECKING:
    from .reliable_executor import ReliableExecutor

#: The task name of the bulk actions (registered by django_reliable_executor/tasks.py).
BULK_ACTION = "django_reliable_executor.bulk_action"
ACTIONS = ("retry", "cancel")
#: Tasks acted on per checkpoint (one durable step) by default.
CHUNK = 500
# Most distinct skip reasons kept in the counts; the rest are counted as OTHER.
MAX_REASONS = 20
OTHER = "other reasons"
LEFT_ALONE = "bulk actions are left alone"
ENDED_AFTER_COUNT = "ended after the count"


@dataclasses.dataclass(frozen=True)
class BulkAction:
    """What one bulk action does (its task's parameter): ``action`` ("retry" or "cancel") on
    the tasks ``list_tasks(**filters)`` lists that were submitted at or after ``since`` (None:
    any time) and at or before ``until``, the moment their ``total`` was counted."""

    action: str
    filters: dict[str, Any]
    since: dt.datetime | None
    until: dt.datetime
    total: int
    chunk: int = CHUNK

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "filters": self.filters,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat(),
            "total": self.total,
            "chunk": self.chunk,
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> BulkAction:
        since = value.get("since")
        return cls(
            action=value["action"],
            filters=dict(value["filters"]),
            since=dt.datetime.fromisoformat(since) if since else None,
            until=dt.datetime.fromisoformat(value["until"]),
            total=int(value["total"]),
            chunk=int(value.get("chunk") or CHUNK),
        )

    @property
    def statuses(self) -> frozenset[TaskStatus] | None:
        """The statuses the filters list (None: any)."""
        if self.filters.get("status") is not None:
            return frozenset({TaskStatus(self.filters["status"])})
        if self.filters.get("statuses") is not None:
            return frozenset(TaskStatus(s) for s in self.filters["statuses"])
        return None


@dataclasses.dataclass
class WalkState:
    """How far a walk got: stored as each chunk's checkpoint, so a walk resumed after its
    worker was lost carries on from the last chunk stored."""

    offset: int = 0  # the matching tasks estimated before the first one not handled yet
    cursor_at: dt.datetime | None = None  # creation time of the last task handled
    cursor_ids: list[str] = dataclasses.field(default_factory=list)  # handled at cursor_at
    examined: int = 0
    changed: int = 0  # retried, or cancelled
    requested: int = 0  # cancel requested of a running task (it ends when its attempt does)
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    done: bool = False
    # A page's parameter search stopped at its storage's bound (Redis): older matches may
    # not have been reached.
    cut_short: bool = False

    def to_json(self) -> dict[str, Any]:
        value = dataclasses.asdict(self)
        value["cursor_at"] = self.cursor_at.isoformat() if self.cursor_at else None
        return value

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> WalkState:
        at = value.get("cursor_at")
        return cls(**{**value, "cursor_at": dt.datetime.fromisoformat(at) if at else None})

    def handled(self, task: TaskInfo, until: dt.datetime) -> bool:
        """Whether ``task`` was handled by this walk already, or is not its to handle (it
        was submitted after the total was counted)."""
        if task.created_at > until:
            return True
        if self.cursor_at is None or task.created_at < self.cursor_at:
            return False
        return task.created_at > self.cursor_at or task.task_id in self.cursor_ids

    def move_past(self, task_id: str, created_at: dt.datetime) -> None:
        if created_at != self.cursor_at:
            self.cursor_at, self.cursor_ids = created_at, []
        self.cursor_ids.append(task_id)

    def skip(self, reason: str) -> None:
        if reason not in self.skipped and len(self.skipped) >= MAX_REASONS:
            reason = OTHER
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def summary(self, action: str) -> str:
        """E.g. "12,000 retried, 3 skipped"."""
        verb = {"retry": "retried", "cancel": "cancelled"}[action]
        parts = [f"{self.changed:,} {verb}"]
        if self.requested:
            parts.append(f"cancel requested for {self.requested:,} running")
        skipped = sum(self.skipped.values())
        if skipped:
            parts.append(f"{skipped:,} skipped")
        if self.cut_short:
            parts.append("the parameter search stopped at its bound: older matches not reached")
        return ", ".join(parts)


Report = Callable[[WalkState], object]


@dataclasses.dataclass
class ChunkPlan:
    """The tasks one chunk acts on, chosen and stored (a durable step) before it acts on any:
    a walk resumed after its worker was lost mid-chunk acts again on exactly these, skipping
    those already changed (*PENDING cannot be retried*), where a new listing would miss them:
    a retried dead letter has left a "dead letters" filter."""

    start: int  # the offset the page was read from
    taken: list[tuple[str, str, str]]  # the page's head: (task id, created_at, status listed)
    new: list[str]  # the ids among them not handled yet: the ones acted on
    ended: bool  # the walk ends with this chunk
    cut_short: bool  # the page's parameter search stopped at its storage's bound

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> ChunkPlan:
        taken = [(t[0], t[1], t[2]) for t in value["taken"]]
        return cls(**{**value, "taken": taken})


def plan_chunk(executor: ReliableExecutor, bulk: BulkAction, state: WalkState) -> ChunkPlan:
    """Read the page of up to ``bulk.chunk`` tasks not handled yet, from where ``state``
    stands (stepping back when tasks before its offset left the filter)."""
    read = bulk.chunk
    offset = state.offset
    while True:
        start = max(offset - 1, 0)  # one handled task first, to tell nothing shifted
        page = executor.list_tasks(**bulk.filters, limit=read + 1, offset=start)
        if offset > 0 and (not page or not state.handled(page[0], bulk.until)):
            # Tasks before the offset left the filter: step back so that none is skipped.
            offset = max(start - read, 0)
            continue
        taken, ended = _taken(page, bulk, state, bulk.chunk)
        return ChunkPlan(
            start=start,
            taken=[(t.task_id, t.created_at.isoformat(), t.status.value) for t in taken],
            new=[t.task_id for t in taken if not state.handled(t, bulk.until)],
            ended=ended,
            cut_short=cut_short(page),
        )


def act_chunk(
    executor: ReliableExecutor, bulk: BulkAction, state: WalkState, plan: ChunkPlan, report: Report
) -> WalkState:
    """Act on the tasks ``plan`` chose, as they are now (read again: some may have been
    changed by this very chunk before its worker was lost, or by anyone since)."""
    fresh = executor.storage.get_many(plan.new)
    gone = [task_id for task_id in plan.new if task_id not in fresh]
    for _ in gone:
        state.skip("purged meanwhile")
    now = _act(executor, bulk.action, [fresh[i] for i in plan.new if i in fresh], state, bulk.until)
    created = {task_id: dt.datetime.fromisoformat(at) for task_id, at, _ in plan.taken}
    for task_id in plan.new:
        state.move_past(task_id, created[task_id])
    state.examined += len(plan.new)
    # What the page read still holds of the filter: where the next page starts.
    wanted = bulk.statuses
    kept = [now.get(task_id, frozenset({TaskStatus(status)})) for task_id, _, status in plan.taken]
    state.offset = plan.start + sum(wanted is None or bool(s & wanted) for s in kept)
    state.done = plan.ended
    state.cut_short = state.cut_short or plan.cut_short
    report(state)
    return state


def _taken(
    page: list[TaskInfo], bulk: BulkAction, state: WalkState, budget: int
) -> tuple[list[TaskInfo], bool]:
    """The head of ``page`` a chunk goes through (up to ``budget`` tasks not handled yet,
    and the handled ones among them), and whether the walk ends with it."""
    taken: list[TaskInfo] = []
    for task in page:
        if bulk.since is not None and task.created_at < bulk.since:
            return taken, True  # newest first: every later one is older still
        if not state.handled(task, bulk.until):
            if budget == 0:
                return taken, False
            budget -= 1
        taken.append(task)
    return taken, len(page) <= bulk.chunk


def _act(
    executor: ReliableExecutor,
    action: str,
    tasks: list[TaskInfo],
    state: WalkState,
    until: dt.datetime,
) -> dict[str, frozenset[TaskStatus]]:
    """Retry or cancel ``tasks`` as the admin's actions do: the statuses each may have now."""
    now: dict[str, frozenset[TaskStatus]] = {}
    mine = [task for task in tasks if task.task_name != BULK_ACTION]
    if len(mine) < len(tasks):
        state.skipped[LEFT_ALONE] = state.skipped.get(LEFT_ALONE, 0) + len(tasks) - len(mine)
    if action == "retry":
        # A task that ended after the count was not a dead letter then: this walk retried it
        # in a chunk walked again after its worker was lost (and it failed again since), or
        # it failed after the total was shown. Either way it is not retried (again).
        late = [t for t in mine if t.finished_at is not None and t.finished_at > until]
        for task in late:
            state.skip(ENDED_AFTER_COUNT)
            now[task.task_id] = frozenset({task.status})
        mine = [task for task in mine if task.task_id not in now]
        # Dependents first, one at a time, as a walk task by task would (newest first, a
        # dependent comes before its dependencies): retried after them, it would wait for
        # them again instead of being refused.
        for task in mine:
            if task.depends_on:
                now[task.task_id] = _retry(executor, task, state)
        plain = [t.task_id for t in mine if t.status in RETRYABLE_BY_HAND and not t.depends_on]
        # The tasks a retry only resets, in one statement where the storage can; the
        # transitions announced as retry_task's are.
        transitions, _ = executor.storage.retry_plain(plain)
        for transition in transitions:
            executor.announcer.retried(transition)
            now[transition.task.task_id] = WAITING_STATUSES
        state.changed += len(transitions)
    for task in mine:
        if task.task_id not in now:
            act = _retry if action == "retry" else _cancel
            now[task.task_id] = act(executor, task, state)
    return now


def _retry(executor: ReliableExecutor, task: TaskInfo, state: WalkState) -> frozenset[TaskStatus]:
    if task.status not in RETRYABLE_BY_HAND:
        state.skip(f"{task.status.value} cannot be retried")
        return frozenset({task.status})
    reason = executor.retry_task_or_reason(task.task_id)
    if reason is None:
        state.changed += 1
        return WAITING_STATUSES  # PENDING, or CREATED waiting for its dependencies again
    state.skip(_reason_kind(reason))
    return frozenset({task.status})


def _cancel(executor: ReliableExecutor, task: TaskInfo, state: WalkState) -> frozenset[TaskStatus]:
    running = task.status is TaskStatus.RUNNING
    if running and task.cancel_requested:
        state.skip("RUNNING with cancel already requested")
    elif task.status not in WAITING_STATUSES and not running:
        state.skip(f"{task.status.value} cannot be cancelled")
    elif not executor.cancel_task(task.task_id):
        state.skip("changed meanwhile")
    elif running:
        state.requested += 1  # it ends when its attempt does (cancel semantics)
    else:
        state.changed += 1
        return frozenset({TaskStatus.CANCELLED})
    return frozenset({task.status})


def _reason_kind(reason: str) -> str:
    """A skip reason without the task's own details, so that the counts group them."""
    if reason.startswith("its previous attempt is still running"):
        return "its previous attempt is still running"
    if reason.startswith("its dependency "):
        return "a dependency ended otherwise than COMPLETED"
    return reason


def walk_chunk(
    executor: ReliableExecutor, bulk: BulkAction, state: WalkState, report: Report
) -> WalkState:
    """One chunk in one go, plan and act (the bulk action's handler stores each apart)."""
    return act_chunk(executor, bulk, state, plan_chunk(executor, bulk, state), report)
