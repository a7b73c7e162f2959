"""ReliableExecutor: the public service: submit (checked by ``submission``), query, operate and
schedule tasks through the storage."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Unpack

from ..conf import ExecutorSettings, get_settings
from ..core.batches import BatchInfo
from ..core.clock import Clock, system_clock
from ..core.minute_counts import CHART_MINUTES, MinuteCounts
from ..core.parameter_filter import checked_parameter, storable
from ..core.parameter_index import search_entries
from ..core.queries import KeyUse, RateUse
from ..core.records import SubmitOptions, TaskInfo, TaskSubmitRequest, WorkerInfo
from ..core.states import TaskStatus
from ..observability.announcer import Announcer
from ..observability.tracing import current_trace_context
from ..registry import FLOW_LIMITS, declared_schedules, key_limits, rate_limits
from ..schedules.records import Schedule, ScheduleInfo
from ..storage import MASTER_LOCK_NAME, TaskStorage, build_storage
from .batches import submit_batch
from .interventions import TaskInterventions
from .listing import checked_statuses, plausible_filters, plausible_tag, storable_id
from .on_commit import after_commit, open_transaction, submit_on_commit
from .purging import finished_statuses, in_rounds
from .queues import check_known_queue
from .schedules import ScheduleOperations
from .stacks import LiveStacks
from .submitting import chain_steps, prepare, request_of, request_time


class ReliableExecutor(TaskInterventions, LiveStacks):
    """The public service. Thread-safe; storage is built from settings on first use."""

    def __init__(
        self,
        storage: TaskStorage | None = None,
        *,
        clock: Clock | None = None,
        settings: ExecutorSettings | None = None,
    ) -> None:
        self._storage = storage
        self._clock = clock
        self._settings = settings
        self._lock = threading.Lock()
        #: Signals, log lines and metrics of transitions (the worker and the chores use it).
        self.announcer = Announcer(sender=ReliableExecutor)
        self._schedules = ScheduleOperations(
            storage=lambda: self.storage,
            clock=lambda: self.clock,
            settings=lambda: self.settings,
            prepare=prepare,
        )

    # -- wiring ---------------------------------------------------------------------------
    @property
    def settings(self) -> ExecutorSettings:
        return self._settings or get_settings()

    @property
    def clock(self) -> Clock:
        if self._clock is not None:
            return self._clock
        return self._storage.clock if self._storage is not None else system_clock

    @property
    def storage(self) -> TaskStorage:
        if self._storage is None:
            with self._lock:
                if self._storage is None:
                    self._storage = build_storage(self.settings, self._clock, FLOW_LIMITS)
        return self._storage

    def reset(self) -> None:
        """Forget the storage so the next call builds it from current settings (tests)."""
        with self._lock:
            self._storage = None

    # -- submitting -----------------------------------------------------------------------
    def submit_task(self, request: TaskSubmitRequest) -> TaskInfo:
        """Store one task and return it; an existing ``task_id`` returns the stored task as is.

        On database storage the row is written in the caller's transaction, if any.
        Raises a TaskSubmitError subclass (and stores nothing) on bad input.
        """
        return self.submit_many([request])[0]

    def submit(
        self, task_name: str, parameter: Any = None, **options: Unpack[SubmitOptions]
    ) -> TaskInfo:
        """Shorthand for ``submit_task(TaskSubmitRequest(task_name, parameter, **options))``."""
        return self.submit_task(request_of(task_name, parameter, options))

    def submit_many(self, requests: Sequence[TaskSubmitRequest]) -> list[TaskInfo]:
        """Validate every request first (one bad request stores nothing), then store them all
        in one batch. Returns the tasks in request order."""
        return [info for info, _ in self.submit_many_created(requests)]

    def submit_many_created(
        self, requests: Sequence[TaskSubmitRequest]
    ) -> list[tuple[TaskInfo, bool]]:
        """``submit_many``, telling for each request whether its task was stored by this call:
        False when an existing task answers it (its task_id is taken, or a live task holds its
        unique key, stored before or by an earlier request of this call). The content of a
        task stored before is another submitter's: the API shows it only to a caller who may
        read tasks. On Redis inside ``atomic()`` it says what the write at commit is expected
        to do."""
        now = self.clock.now()
        settings = self.settings
        trace = current_trace_context()  # the caller's span, if it is traced: once per call
        new_id = self.storage.new_task_id
        count = len(requests)
        new_tasks = [
            prepare(request, request_time(now, i, count), settings, i, trace, new_id)
            for i, request in enumerate(requests)
        ]
        if not new_tasks:
            return []
        storage = self.storage
        if not storage.supports_transactional_enqueue:
            alias = open_transaction(settings)
            if alias is not None:
                return submit_on_commit(storage, self.announcer, new_tasks, alias)
        results = storage.enqueue(new_tasks)
        created = [info for info, was_created in results if was_created]
        if created:
            after_commit(storage, lambda: self.announcer.submitted(created))
        return [(info, bool(was_created)) for info, was_created in results]

    def chain(self, requests: Sequence[TaskSubmitRequest]) -> list[TaskInfo]:
        """Submit ``requests`` as a chain in one call: each depends on the one before it (as
        well as on its own ``depends_on``), so they run one after another, and a step that
        fails cancels the rest (unless a step says ``on_dependency_failure="run"``). Steps
        without a task_id get one. All or nothing, like submit_many."""
        return self.submit_many(chain_steps(requests))

    def submit_batch(
        self,
        requests: Sequence[TaskSubmitRequest],
        batch_id: str | None = None,
        on_complete: TaskSubmitRequest | None = None,
        on_success: TaskSubmitRequest | None = None,
    ) -> BatchInfo:
        """Submit ``requests`` as one batch (default id: a uuid4 hex). ``on_complete`` is
        submitted exactly once when every member has ended, ``on_success`` only if every one
        COMPLETED (see batches.py and docs/workflows.md). Raises a TaskSubmitError naming the
        field, storing nothing, on a bad member or callback, an empty batch or a used id."""
        return submit_batch(
            self.storage,
            self.settings,
            self.announcer,
            self.clock.now(),
            requests,
            batch_id,
            on_complete,
            on_success,
        )

    def get_batch(self, batch_id: str) -> BatchInfo | None:
        """The batch's counts, or None for an unknown id."""
        if not storable_id(batch_id):
            return None
        return self.storage.get_batch(batch_id)

    # -- querying and operating -----------------------------------------------------------
    def get_task(self, task_id: str) -> TaskInfo | None:
        """The stored task, or None for an unknown id (never a made-up pending state)."""
        if not storable_id(task_id):
            return None
        return self.storage.get(task_id)

    def dependents_of(self, task_id: str, limit: int | None = None) -> list[str]:
        """The ids of the tasks submitted to wait for ``task_id`` (``depends_on``), sorted;
        with ``limit``, at most that many are read (see ``count_dependents`` for the rest)."""
        if not storable_id(task_id):
            return []
        return self.storage.dependents_of(task_id, limit)

    def count_dependents(self, task_id: str) -> int:
        """How many tasks were submitted to wait for ``task_id``."""
        return self.storage.count_dependents(task_id) if storable_id(task_id) else 0

    def list_tasks(
        self,
        status: TaskStatus | str | None = None,
        task_name: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        offset: int = 0,
        *,
        statuses: Iterable[TaskStatus | str] | None = None,
        batch_id: str | None = None,
        schedule_runs: bool | None = None,
        schedule_id: str | None = None,
        tag: str | None = None,
        parameter: Mapping[str, Any] | None = None,
    ) -> list[TaskInfo]:
        """Tasks newest first, filtered by any of status, task_name, queue, batch_id (a
        batch's members and its callbacks, which carry its id too), tag (the tasks
        submitted with that tag) and parameter (the tasks whose parameter is a JSON object
        holding each of these top-level keys with an equal JSON scalar: 42 matches 42 and 42.0,
        not "42"; see docs/python-api.md for what each storage reads to find them).

        ``statuses`` lists the tasks of any of several statuses together, e.g. the dead letters
        (``statuses=FAILURE_STATUSES``: FAILED, TIMEOUT and ERROR); give it or ``status``, not
        both. ``schedule_runs=False`` leaves out the tasks schedules fired (their ids are
        ``<schedule id>@<planned time>``), ``True`` lists only them; ``schedule_id`` lists
        the runs of one schedule. ``limit`` is at most 10**18 (ValueError past it); an
        ``offset`` past 10**18 lists nothing."""
        checked, chosen = checked_statuses(status, statuses)
        pairs = checked_parameter(parameter)
        if not plausible_filters(
            limit, offset, task_name, queue, batch_id, schedule_runs, schedule_id
        ) or not (plausible_tag(tag) and (pairs is None or storable(pairs))):
            return []
        return self.storage.list(
            status=checked,
            statuses=chosen,
            task_name=task_name,
            queue=queue,
            limit=limit,
            offset=offset,
            batch_id=batch_id,
            schedule_runs=schedule_runs,
            schedule_id=schedule_id,
            tag=tag,
            parameter=pairs,
            indexed=search_entries(pairs, self.settings.SEARCHABLE_PARAMETERS),
        )

    def count_by_status(self, queue: str | None = None) -> dict[TaskStatus, int]:
        """How many tasks are in each status (every status present, zero included)."""
        return self.storage.count(queue)

    def count_by_queue(self) -> dict[str, dict[TaskStatus, int]]:
        """Counts by status for every queue that holds tasks (every status present)."""
        return self.storage.count_by_queue()

    def rate_limit_use(self) -> list[RateUse]:
        """For each registered handler with a ``rate_limit``: its starts in the last window
        (every rate key, and the busiest key) and the waiting tasks it holds back now."""
        limits = rate_limits()
        return self.storage.rate_use(limits) if limits else []

    def concurrency_key_use(self) -> list[KeyUse]:
        """For each registered handler with a ``max_concurrency_per_key``: the tasks held
        with a ``concurrency_key``, how many keys hold them, and the busiest keys."""
        limits = key_limits()
        return self.storage.key_use(limits) if limits else []

    def oldest_due_at(self, queue: str | None = None) -> dt.datetime | None:
        """When the longest-waiting task that is due and not claimed became due, or None:
        its age is how far the workers are behind."""
        return self.storage.oldest_due(queue)

    def oldest_due_by_queue(self) -> dict[str, dt.datetime]:
        """``oldest_due_at`` of every queue with a task due and not claimed, read at once."""
        return self.storage.oldest_due_by_queue()

    def throughput(self, minutes: int = CHART_MINUTES) -> list[MinuteCounts]:
        """Tasks completed, failed (FAILED, TIMEOUT, ERROR) and retried (automatic retries
        scheduled) in each of the last ``minutes`` UTC minutes, oldest first, the current
        minute last (see ``django_reliable_executor.core.minute_counts``)."""
        return self.storage.throughput(minutes)

    def completed_by_queue(
        self, queues: Sequence[str], minutes: int = CHART_MINUTES
    ) -> dict[str, list[int]]:
        """Tasks completed in each of ``queues`` in each of the last ``minutes`` UTC minutes:
        by queue (in the order given), each list oldest first, the current minute last, zeros
        where none completed. Reads only the queues given: the caller bounds how many (the
        admin's summary asks for at most ``SPARKLINE_QUEUES``)."""
        return self.storage.completed_by_queue(queues, minutes)

    def master(self) -> str | None:
        """The worker id holding the master lock now, or None."""
        return self.storage.lock_owner(MASTER_LOCK_NAME)

    def workers(self) -> list[WorkerInfo]:
        """The workers alive by their heartbeats (forgotten once silent for 2 x LEASE_TIMEOUT)."""
        return self.storage.workers()

    # -- paused queues ----------------------------------------------------------------------
    def pause_queue(self, name: str) -> bool:
        """Stop every worker claiming tasks of queue ``name``, stored so that it holds for
        every worker, restarts included (from each worker's next claim). Running tasks
        finish; submits and schedule fires into it are accepted and wait. True when paused
        now, False when it already was. Raises InvalidQueueError (storing nothing) for a name
        the queue rule refuses or that nothing uses (see queue_pausing.check_known_queue)."""
        return self.storage.pause_queue(check_known_queue(self.storage, name))

    def resume_queue(self, name: str) -> bool:
        """Let workers claim from ``name`` again; idle workers are woken at once. True when it
        was paused, False when not (no error). Raises InvalidQueueError like pause_queue."""
        return self.storage.resume_queue(check_known_queue(self.storage, name))

    def paused_queues(self) -> set[str]:
        """The queues paused now."""
        return self.storage.paused_queues()

    def purge_finished(
        self,
        finished_before: dt.datetime,
        *,
        statuses: Iterable[TaskStatus | str] | None = None,
        batch: int = 500,
        progress: Callable[[int], None] | None = None,
        pause_seconds: float = 0.0,
    ) -> int:
        """Delete terminal tasks (of ``statuses``, default every terminal one) that finished
        before ``finished_before``, ``batch`` at a time; ``progress(deleted_so_far)`` after each
        batch, and a pause of ``pause_seconds`` before the next (pacing: a large purge then
        leaves the database's vacuum, its replicas and the workers room to keep up). Returns
        how many were deleted."""
        chosen = finished_statuses(statuses)
        return in_rounds(
            lambda: self.storage.purge_finished(finished_before, batch, chosen),
            batch,
            pause_seconds,
            self.clock.sleep,
            progress,
        )

    def purge_batches(
        self, finished_before: dt.datetime, *, batch: int = 500, pause_seconds: float = 0.0
    ) -> int:
        """Delete the batches that finished before ``finished_before`` (``get_batch`` then
        answers None; members still stored keep their ``batch_id``), ``batch`` at a time, with
        a pause of ``pause_seconds`` between rounds as ``purge_finished``. Batches not finished
        are kept. Returns how many were deleted."""
        return in_rounds(
            lambda: self.storage.purge_batches(finished_before, batch),
            batch,
            pause_seconds,
            self.clock.sleep,
        )

    # -- schedules (see schedules/operations.py) ------------------------------------------
    def schedule(
        self,
        schedule_id: str,
        task_name: str,
        parameter: Any = None,
        *,
        every: float | dt.timedelta | None = None,
        cron: str | None = None,
        timezone: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        start_at: dt.datetime | None = None,
        misfire: str = "skip",
        overlap: str = "allow",
        **task_options: Any,
    ) -> ScheduleInfo:
        """Create the schedule, or redefine the one with this id (keeping its state: paused,
        last run, and its next run too if its timing did not change). Fires ``task_name``
        with ``parameter`` every ``every`` seconds (or timedelta) or by ``cron`` in
        ``timezone`` (default: Django's TIME_ZONE). ``misfire`` says what runs missed while no
        master ran (or while paused) do: "skip", "run_once" or "catch_up". ``overlap``: what
        a run falling due while the previous run is not terminal does: "allow" (fire it) or
        "skip" (fire nothing; logged, counted, shown in the admin). ``task_options``:
        retry_limit, retry_interval, retry_backoff, max_duration_millis. Raises
        InvalidScheduleError or a TaskSubmitError naming the bad field; stores nothing then."""
        return self._schedules.schedule(
            schedule_id,
            task_name,
            parameter,
            every=every,
            cron=cron,
            timezone=timezone,
            queue=queue,
            priority=priority,
            start_at=start_at,
            misfire=misfire,
            overlap=overlap,
            **task_options,
        )

    def schedule_many(
        self, schedules: Sequence[Schedule], *, origin: str = "api"
    ) -> list[ScheduleInfo]:
        """Create or redefine several schedules at once: every one is validated first (one bad
        definition stores nothing), unchanged ones are not written. Same order as given."""
        return self._schedules.schedule_many(schedules, origin=origin)

    def get_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """The stored schedule, or None for an unknown id."""
        return self._schedules.get_schedule(schedule_id)

    def list_schedules(
        self, *, limit: int = 100, offset: int = 0, paused: bool | None = None
    ) -> list[ScheduleInfo]:
        """Schedules by id; ``paused=True`` only the paused, ``False`` only the active ones."""
        return self._schedules.list_schedules(limit=limit, offset=offset, paused=paused)

    def count_schedules(self) -> dict[str, int]:
        """``{"active": n, "paused": m}``."""
        return self._schedules.count_schedules()

    def pause_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """Stop firing (a pause survives restarts and redefinitions). None for an unknown id."""
        return self._schedules.pause_schedule(schedule_id)

    def resume_schedule(self, schedule_id: str) -> ScheduleInfo | None:
        """Fire again; the runs missed while paused meet the schedule's misfire policy."""
        return self._schedules.resume_schedule(schedule_id)

    def delete_schedule(self, schedule_id: str) -> bool:
        """Forget the schedule; the tasks it fired stay. False for an unknown id."""
        return self._schedules.delete_schedule(schedule_id)

    def run_schedule_now(self, schedule_id: str) -> str:
        """Fire one run of the schedule now, beside its planned runs (which it neither
        consumes nor moves), and return its task id: ``<schedule_id>@<now>Z``, in the id
        namespace of the schedule's runs. While a run started this way is not finished, a
        new call returns that run's id instead (double clicks, two operators at once).
        Raises UnknownScheduleError (a ValueError) for an unknown id, storing nothing."""
        info, created = self._schedules.run_schedule_now(schedule_id)
        if created:
            self.announcer.submitted([info])
        return info.task_id

    def sync_declared_schedules(self) -> int:
        """Create or update the schedules declared with ``@reliable_task_handler(schedule=)``.
        Run by every runexecutor at start-up. Returns how many were written."""
        return self._schedules.sync_declared_schedules(declared_schedules())


#: The module-level executor: builds its storage from settings on first use.
executor = ReliableExecutor()
