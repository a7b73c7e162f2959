"""Frozen dataclasses exchanged between the service, the worker and the storages."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, TypeVar

from .progress import Progress
from .rate_limits import RateLimit

# What callers ask for, kept in requests.py; named here too, beside the records the service
# turns them into.
from .requests import SubmitOptions, TaskSubmitRequest  # noqa: F401  (re-exported)
from .states import TaskStatus

R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class StepInfo:
    """A durable step's stored checkpoint (``context.step``): its name and when it finished."""

    name: str
    finished_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class TaskInfo:
    """A snapshot of one stored task. Datetimes are aware UTC.

    Attributes:
        task_id: The task's id.
        task_name: The handler's name.
        status: Where the task stands.
        queue: Its queue.
        priority: Its priority (higher runs first).
        parameter: The stored JSON value.
        attempts: Executions started, over the task's whole life.
        retry_limit: Retries after the first attempt, as resolved at submit.
        retry_interval: Milliseconds before a retry (the base of exponential backoff).
        retry_backoff: ``"fixed"`` or ``"exponential"``.
        max_duration_millis: Milliseconds from creation until TIMEOUT, or None.
        created_at: When it was submitted.
        run_at: When it may next start.
        started_at: When its last attempt started, or None.
        finished_at: When it reached a terminal status, or None.
        last_error: The last failure, with its traceback, or None.
        result: The JSON value the handler returned, or None.
        worker_id: The worker that holds or last held it, or None.
        cancel_requested: A cancel was requested while it ran.
        progress: The handler's last ``set_progress`` report (``current``, ``total``,
            ``message``, ``updated_at``), or None.
        depends_on: The tasks it was submitted to wait for.
        waiting_for: Those of them it still waits for.
        trace_context: The W3C trace context of the span that submitted it, or None.
        batch_id: The batch it is a member or a callback of, or None.
        handler_running: A handler of the task still runs: RUNNING, or terminal while a
            timed-out handler runs on. A terminal task has ended only once this is False.
        attempt_timeout: Seconds each attempt may run, or None.
        steps: The durable steps (``context.step``) whose checkpoints are stored, in the
            order they finished. Read by ``get_task``, ``storage.get_many`` and
            ``list_tasks`` (one more query per page of tasks on the database, one more round
            trip on Redis for the tasks that stored any); the worker's own records (claims,
            transitions) leave it empty.
        waiting: What a PENDING task waits for (a durable wait: ``context.sleep``,
            ``wait_for_event``, ``wait_for``): ``{"kind": "sleep" | "event" | "tasks",
            "name", "until", "event", "task_ids"}``; None otherwise.
        resumptions: How many times the task was handed back at a wait or a stop, the
            current wait included (1 in its first wait); a resumption is not an attempt.
        concurrency_key: The key its name's ``max_concurrency_per_key`` counts it under, or
            None.
        rate_key: The key its name's ``rate_limit`` counts its starts under, or None.
        tags: The tags it was submitted with (``list_tasks(tag=...)`` finds it by each),
            in the order given; () for none.
        debounced: Set in what a debounced submit returns when it joined this task, already
            waiting, rather than storing one (core/debouncing.py); False everywhere else.
    """

    task_id: str
    task_name: str
    status: TaskStatus
    queue: str
    priority: int
    parameter: Any
    attempts: int
    retry_limit: int
    retry_interval: int
    retry_backoff: str
    max_duration_millis: int | None
    created_at: dt.datetime
    run_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    last_error: str | None
    result: Any
    worker_id: str | None
    cancel_requested: bool
    # The handler's last set_progress() (progress.Progress), None before any.
    progress: Progress | None = None
    # The tasks it was submitted to wait for, and those of them still awaited (not terminal).
    depends_on: tuple[str, ...] = ()
    waiting_for: tuple[str, ...] = ()
    # The W3C trace context of the span that submitted it ({"traceparent": ..., and
    # "tracestate" when there is one}); None when submitted outside a trace (see tracing.py).
    trace_context: dict[str, str] | None = None
    # The batch (executor.submit_batch) this task is a member or a callback of; None if none.
    batch_id: str | None = None
    # A handler of this task still runs, as far as the storage knows: RUNNING, or terminal
    # while the handler of its last attempt runs on (a TIMEOUT in the thread pool or on the
    # event loop), until the worker reports it returned or its lease lapses. A terminal task
    # has *ended* (docs/guarantees.md) only once this is False.
    handler_running: bool = False
    # Seconds each attempt may run (None: no limit of its own; a worker then applies its
    # handler's attempt_timeout, if any).
    attempt_timeout: float | None = None
    # The durable steps stored, in finishing order (empty in claims and transitions).
    steps: tuple[StepInfo, ...] = ()
    # A PENDING task's durable wait (core/waits.py Wait.describe()); None otherwise.
    waiting: dict[str, Any] | None = None
    resumptions: int = 0
    concurrency_key: str | None = None
    rate_key: str | None = None
    debounced: bool = False
    tags: tuple[str, ...] = ()

    @property
    def is_terminal(self) -> bool:
        """The status is COMPLETED, FAILED, TIMEOUT, CANCELLED or ERROR."""
        return self.status.is_terminal


@dataclasses.dataclass(frozen=True)
class NewTask:
    """A validated, serialised task ready to be stored (built by the service)."""

    task_id: str
    task_name: str
    queue: str
    priority: int
    parameter: Any
    retry_limit: int
    retry_interval: int
    retry_backoff: str
    max_duration_millis: int | None
    created_at: dt.datetime
    run_at: dt.datetime
    deadline_at: dt.datetime | None
    # A unique task: the digest of its key (``uniqueness.unique_digest``) and when the key
    # stops holding; None for an ordinary task.
    unique_key: str | None = None
    unique_until: dt.datetime | None = None
    rate_key: str | None = None
    concurrency_key: str | None = None
    # A debounced task (core/debouncing.py): its seconds and longest wait; unique_key is then
    # its debounce key (debounce_digest) and unique_until when that key's row may be purged.
    debounce: float | None = None
    debounce_max_wait: float | None = None
    depends_on: tuple[str, ...] = ()  # checked: existing ids, folded, not its own
    on_dependency_failure: str = "cancel"
    trace_context: dict[str, str] | None = None  # the submitter's span (TaskInfo's field)
    # A member of this batch (counted in its totals); None for an ordinary task.
    batch_id: str | None = None
    # Which batch of that id (NewBatch.generation): a batch id may be used again once its
    # batch was purged, and a member counts only in the batch it was submitted to.
    batch_generation: str | None = None
    attempt_timeout: float | None = None  # seconds (TaskInfo's field)
    tags: tuple[str, ...] = ()  # checked and folded (core/tags.py)
    # Its entries in the parameter index (core/parameter_index.py; setting SEARCHABLE_PARAMETERS).
    indexed: tuple[tuple[str, str], ...] = ()


def copy_with(record: R, **changes: Any) -> R:
    """``dataclasses.replace`` for the frozen records of this module, without running
    ``__init__`` again: the worker copies a claim and its TaskInfo at every start and outcome,
    and ``replace`` (which rebuilds the keyword arguments field by field) cost more there than
    the rest of the start. Nothing is skipped: these records have no ``__post_init__``."""
    assert changes.keys() <= vars(record).keys(), f"not fields: {set(changes) - set(vars(record))}"
    copy = object.__new__(type(record))
    vars(copy).update(vars(record), **changes)
    return copy


def build(cls: type[R], fields: dict[str, Any]) -> R:
    """``cls(**fields)`` for the frozen records of this module, without running ``__init__``: a
    frozen dataclass's ``__init__`` sets each field through ``object.__setattr__`` (seven
    bytecode steps a field, ~150 for a TaskInfo), which the worker pays for every task it
    claims. ``fields`` must name every field: no default is filled in."""
    record = object.__new__(cls)
    record.__dict__.update(fields)
    return record


@dataclasses.dataclass(frozen=True)
class Claim:
    """A task a worker holds under a lease. ``token`` fences every write the worker makes.

    ``budget_attempts`` counts executions against the current retry budget (reset by a manual
    retry); ``task.attempts`` counts every execution ever started.
    """

    task: TaskInfo
    token: int
    budget_attempts: int
    deadline_at: dt.datetime | None
    # A claim of a rate-limited name on the database storage: its limit, and the time and
    # rate key ("" for none) it was logged under, which its start checks (see
    # storage/database/rate_log.py and rate_starts.py).
    rate_limit: RateLimit | None = None
    rate_logged_at: dt.datetime | None = None
    rate_key: str = ""
    # The database storage: the task had dependents when claimed, so its ending must settle
    # them. False is only a hint (a dependent may be stored after the claim); the ending
    # write checks it (see storage/database/transitions.py). Unused elsewhere.
    has_dependents: bool = False
    # The Redis storage with REDIS_SHARDS > 1: the shard the task was claimed on, where it is
    # stored and every write of the claim goes (a task is not always on its queue's shard:
    # docs/redis-shards.md). 0 elsewhere.
    shard: int = 0

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def is_started(self) -> bool:
        """Started already (RUNNING, its attempt counted): by ``start``, or by the claim itself
        (``TaskStorage.claim``'s ``start``)."""
        return self.task.status is TaskStatus.RUNNING

    # These two run for every task a worker starts and completes: they copy the records as
    # copy_with does, without its check of the field names (they name fields of these classes).
    def started(self, now: dt.datetime) -> Claim:
        """This claim once its start was recorded: RUNNING, one more attempt counted."""
        info = self.task
        task = object.__new__(TaskInfo)
        task.__dict__.update(
            info.__dict__,
            status=TaskStatus.RUNNING,
            attempts=info.attempts + 1,
            started_at=now,
            handler_running=True,
        )
        claim = object.__new__(Claim)
        claim.__dict__.update(self.__dict__, task=task, budget_attempts=self.budget_attempts + 1)
        return claim

    def completed(self, result: Any, now: dt.datetime) -> Transition:
        """The transition of recording this (started) claim's success."""
        task = object.__new__(TaskInfo)
        task.__dict__.update(
            self.task.__dict__,
            status=TaskStatus.COMPLETED,
            result=result,
            finished_at=now,
            handler_running=False,
        )
        transition = object.__new__(Transition)
        transition.__dict__.update(task=task, previous=TaskStatus.RUNNING)
        return transition


@dataclasses.dataclass(frozen=True)
class Transition:
    """A state change that happened: what the service turns into signals, logs and metrics."""

    task: TaskInfo
    previous: TaskStatus

    @property
    def status(self) -> TaskStatus:
        return self.task.status


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """A runexecutor process as its heartbeats describe it."""

    worker_id: str
    hostname: str
    pid: int
    queues: tuple[str, ...]
    started_at: dt.datetime
    last_seen_at: dt.datetime


@dataclasses.dataclass(frozen=True)
class CancelResult:
    """Outcome of a cancel: ``changed`` is what cancel_task returns."""

    changed: bool
    task: TaskInfo | None
    requested_only: bool = False  # True when the task was RUNNING: only the flag was set


def created_info(
    task_id: str,
    task_name: str,
    queue: str,
    priority: int,
    parameter: Any,
    retry_limit: int,
    retry_interval: int,
    retry_backoff: str,
    max_duration_millis: int | None,
    created_at: dt.datetime,
    run_at: dt.datetime,
    trace_context: dict[str, str] | None = None,
    batch_id: str | None = None,
    attempt_timeout: float | None = None,
    concurrency_key: str | None = None,
    rate_key: str | None = None,
    tags: tuple[str, ...] = (),
) -> TaskInfo:
    """A task as it stands once stored: CREATED, never attempted, nothing recorded yet."""
    return build(
        TaskInfo,
        {
            "task_id": task_id,
            "task_name": task_name,
            "status": TaskStatus.CREATED,
            "queue": queue,
            "priority": priority,
            "parameter": parameter,
            "attempts": 0,
            "retry_limit": retry_limit,
            "retry_interval": retry_interval,
            "retry_backoff": retry_backoff,
            "max_duration_millis": max_duration_millis,
            "created_at": created_at,
            "run_at": run_at,
            "started_at": None,
            "finished_at": None,
            "last_error": None,
            "result": None,
            "worker_id": None,
            "cancel_requested": False,
            "progress": None,
            "depends_on": (),
            "waiting_for": (),
            "trace_context": trace_context,
            "batch_id": batch_id,
            "handler_running": False,
            "attempt_timeout": attempt_timeout,
            "steps": (),
            "concurrency_key": concurrency_key,
            "rate_key": rate_key,
            "debounced": False,
            "tags": tags,
        },
    )


def new_info(task: NewTask) -> TaskInfo:
    """What a task just stored from ``task`` looks like."""
    return created_info(
        task.task_id,
        task.task_name,
        task.queue,
        task.priority,
        task.parameter,
        task.retry_limit,
        task.retry_interval,
        task.retry_backoff,
        task.max_duration_millis,
        task.created_at,
        task.run_at,
        task.trace_context,
        task.batch_id,
        task.attempt_timeout,
        task.concurrency_key,
        task.rate_key,
        task.tags,
    )
