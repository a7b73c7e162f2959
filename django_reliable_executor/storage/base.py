"""The storage interface: one method per state change, each atomic, taking and returning records.

Where each method lives in the two backends, as ``<module of storage/database/> / <module of
storage/redis/>: methods`` (``base``: this module's default; ``schedule_base``,
``lease_base``, ``batch_base``, ``step_base``, ``flow_base``, ``stack_base``, ``read_base``:
those modules' defaults;
``access``: the backend's access base; ``__init__``: the backend's package). The same module on
both sides is the rule. A default module on one side means that backend keeps the interface's
default where the other needs its own (a sharded Redis picks ids, checks its layout and splits
its chores; the database marks limited names). ``_list`` and ``_count_tasks`` are the other
exceptions: Redis's listing.py holds the walks of its list indexes.
tests/unit/test_storage_modules.py keeps the table true.

    submitting / submitting: enqueue
    reading / reading: unique_holder
    base / access: new_task_id
    batches / batches: add_to_batch existing_ids get_batch open_batch purge_batches seal_batch
    base / base: claim purge_finished
    read_base / read_base: completed_by_queue count_tasks list throughput
    transitions / base: retry_plain
    claiming / claiming: _claim
    transitions / transitions: start start_many complete complete_many fail expire_claim
    transitions / transitions: release handler_returned cancel retry heartbeat
    progress / progress: record_progress
    steps / steps: record_step step_results
    waits / waits: count_waiting send_event suspend task_events
    pausing / pausing: pause_queue paused_queues resume_queue
    chores / chores: _purge_finished expire_overdue recover_expired
    base / chores: promote_due
    base / access: deliver_messages
    base / waits: settle_waits
    chores / base: mark_limited
    reading / reading: _completed_by_queue _minute_counts count count_by_queue dependents_of
    reading / reading: count_dependents get_many has_work
    reading / reading: oldest_due oldest_due_by_queue rate_use key_use
    reading / listing: _count_tasks _list
    access / access: close get
    claiming / claiming: wait_for_work wake
    claiming / base: stop_waiting
    locks / locks: acquire_lock lock_owner release_lock spend_nonce
    lease_base / locks: lock_owners
    workers / workers: forget_workers worker_gone worker_last_seen worker_seen workers
    base / access: check_layout chores_on
    __init__ / __init__: location server_warnings
    schedules / schedules: count_schedules delete_schedule due_schedules get_schedules
    schedules / schedules: list_schedules next_schedule_due set_schedule_paused
    schedule_base / schedule_base: save_schedules
    schedule_base / schedule_fires: fire_due
    schedule_fires / schedule_fires: fire_schedules
    schedule_skips / schedule_skips: add_schedule_skips schedule_skips
    stacks / stacks: add_stack_request answer_stack get_stack_request take_stack_requests
"""

from __future__ import annotations

import abc
import builtins
import datetime as dt
import uuid
from collections.abc import Collection, Mapping, Sequence

from ..core.clock import Clock, system_clock
from ..core.flow_limits import NO_FLOW_LIMITS, FlowLimits
from ..core.progress import Progress
from ..core.queries import ClaimRequest
from ..core.rate_limits import RateLimit
from ..core.records import CancelResult, Claim, NewTask, TaskInfo, Transition
from ..core.states import TaskStatus
from .batch_base import BatchStorage
from .checks import claim_request, purged_statuses
from .flow_base import FlowStorage
from .lease_base import LeaseStorage
from .read_base import ReadStorage
from .schedule_base import ScheduleStorage
from .stack_base import StackStorage
from .step_base import StepStorage


class TaskStorage(
    ReadStorage,
    BatchStorage,
    ScheduleStorage,
    LeaseStorage,
    StepStorage,
    FlowStorage,
    StackStorage,
):
    """Where tasks live. Every transition is a compare-and-set on the expected prior state (and
    the claim's fencing token where a worker writes): a lost race changes nothing and returns
    None/False. Implementations know SQL or Redis; nothing above them does.
    """

    #: enqueue() writes inside the caller's open transaction (database storage). Without it,
    #: the service defers submits made inside atomic() to on_commit.
    supports_transactional_enqueue: bool = False
    #: wait_for_work() blocks until work may have arrived (Redis, the database storage);
    #: otherwise idle workers poll.
    blocking_wait: bool = False

    def __init__(
        self, clock: Clock | None = None, flow_limits: FlowLimits = NO_FLOW_LIMITS
    ) -> None:
        self.clock = clock or system_clock
        #: The task names claimed one name at a time, and their home queues (the service
        #: passes the registry's).
        self.flow_limits = flow_limits

    @abc.abstractmethod
    def location(self) -> dict[str, str]:
        """Which store this is, for commands to name (it is easy to point a shell at the
        wrong one): ``backend`` ("database" or "redis") and ``database_alias`` or
        ``key_prefix``."""

    @property
    def transaction_alias(self) -> str | None:
        """The Django database alias whose transactions the tasks' writes join (the database
        storage's); None when the tasks live outside Django's databases (Redis)."""
        return None

    @property
    def chore_shards(self) -> int:
        """How many parts the chores split into, each run by the holder of its own lock
        (chore_lock_name); 1 (the master's alone) but on a sharded Redis storage."""
        return 1

    def chores_on(self, shards: frozenset[int]) -> TaskStorage:
        """This storage with its chores (promote_due, recover_expired, expire_overdue,
        purge_finished) confined to ``shards`` of chore_shards; everything else unchanged."""
        return self

    # -- submitting -----------------------------------------------------------------------
    def new_task_id(self, queue: str, task_name: str | None = None) -> str:
        """A new task id (32 hex digits) for a task of ``queue`` (and ``task_name``) that names
        none: a uuid4; a storage may choose among them (sharded Redis: one whose directory is
        the shard the task is stored on)."""
        return uuid.uuid4().hex

    @abc.abstractmethod
    def enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        """Store new tasks; an existing task_id is left unchanged. Returns ``(info, created)``
        in input order (a task_id repeated within the batch is created once)."""

    @abc.abstractmethod
    def unique_holder(self, unique_key: str) -> TaskInfo | None:
        """The task holding a unique task's key (``NewTask.unique_key``), while its window
        lasts and it is not terminal; else None (a submit of the key would store a task)."""

    # -- the worker's path ----------------------------------------------------------------
    def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        limit: int,
        lease_seconds: float,
        *,
        name_limits: Mapping[str, int] | None = None,
        start: int = 0,
        rate_limits: Mapping[str, RateLimit] | None = None,
        key_limits: Mapping[str, int] | None = None,
        fair_limit: int | None = None,
    ) -> list[Claim]:
        """Take up to ``limit`` due tasks, highest priority first then oldest, under a lease.
        A claimed task keeps its CREATED/PENDING status until ``start``. Never blocks on rows
        another worker is claiming.

        ``start``: the caller has that many threads idle to run claims right now; a storage
        that can (Redis) starts up to that many of the first claims in the same atomic call,
        as ``start_many`` would (RUNNING, an attempt counted, ``started_at`` now), saving the
        start's round trip; a task past its deadline is not started. Those come back RUNNING;
        the others as without ``start``. A storage may start none.

        ``name_limits`` (``{task_name: cap}``, each cap >= 1) caps how many tasks of a name
        are held at once (claimed under a lease, started or not) across every worker: the
        claim takes a task of a capped name only while fewer than its cap are held, checked
        and taken atomically, so concurrent claims never exceed it. Tasks it cannot take stay
        waiting in the storage and do not hold up other names. Names absent are uncapped.

        ``rate_limits`` (``{task_name: RateLimit}``): a task of such a name is claimed only
        while fewer than its count were claimed in the last ``log_window_seconds`` for its
        (name, ``rate_key``), checked and logged atomically with the claim; at most ``start``
        of them per call (the claims go to idle threads, so they start at once). Tasks over
        their limit stay waiting, unclaimed, and do not hold up other names; the storage
        makes an idle worker's ``wait_for_work`` end when their window frees.

        ``key_limits`` (``{task_name: cap}``, each cap >= 1) caps, as ``name_limits`` does,
        the tasks of a name held at once per ``concurrency_key``, each key on its own (tasks
        without a key are capped by ``name_limits`` alone). A task over its key's cap stays
        waiting, and the claim does not read past it again while the key is full.

        ``fair_limit``: of the names with ``fairness="round_robin"`` (``flow_limits.fair()``),
        take at most that many in all (None: no bound). A worker passes its idle threads: a
        fair name's tasks claimed ahead into its local queue would run in claim order while
        the name's turns move on."""
        request = claim_request(
            worker_id,
            queues,
            limit,
            lease_seconds,
            name_limits,
            start,
            rate_limits,
            key_limits,
            fair_limit,
        )
        return [] if request is None else self._claim(request)

    @abc.abstractmethod
    def _claim(self, request: ClaimRequest) -> list[Claim]:
        """``claim`` for at least one queue and one task (the storage's own part)."""

    @abc.abstractmethod
    def start(self, claim: Claim, lease_seconds: float) -> Claim | None:
        """CREATED/PENDING (held with this token) -> RUNNING, counting an attempt. None when the
        task was cancelled, timed out or reclaimed meanwhile: the worker must not run it."""

    def start_many(self, claims: Sequence[Claim], lease_seconds: float) -> list[Claim | None]:
        """``start`` for several claims in one round trip where the backend can; same order."""
        return [self.start(claim, lease_seconds) for claim in claims]

    @abc.abstractmethod
    def heartbeat(
        self, worker_id: str, tokens: Mapping[str, int], lease_seconds: float
    ) -> dict[str, tuple[int, bool]]:
        """Extend the leases this worker still holds: ``tokens`` maps each task id to the
        fencing token of its claim, and only a lease held by ``worker_id`` under that very
        token is renewed (a twin process sharing the worker id cannot keep a dead one's
        leases alive). Returns ``{task_id: (token, cancel_requested)}`` for the tasks still
        held; a task missing from it is lost. A task that timed out while its handler still
        runs stays held (see expire_overdue) and is reported with cancel_requested True,
        until ``handler_returned`` lets it go."""

    @abc.abstractmethod
    def complete(self, claim: Claim, result: object) -> Transition | None:
        """RUNNING -> COMPLETED with ``result``, if the token still matches. ``result`` is a
        plain JSON value, or the ``serialization.Encoded`` a worker made of it: its text is
        written as it is, never serialised again."""

    def complete_many(self, outcomes: Sequence[tuple[Claim, object]]) -> list[Transition | None]:
        """``complete`` for several ``(claim, result)`` pairs at once; same order."""
        return [self.complete(claim, result) for claim, result in outcomes]

    @abc.abstractmethod
    def fail(
        self, claim: Claim, error: str, *, retryable: bool, is_error: bool = False
    ) -> Transition | None:
        """Record a failed attempt: -> PENDING (retry with backoff), FAILED, TIMEOUT (past the
        deadline), CANCELLED (cancel was requested) or, with ``is_error``, ERROR."""

    @abc.abstractmethod
    def record_progress(self, reports: Sequence[tuple[Claim, Progress]]) -> int:
        """Store each claim's handler's progress (``TaskInfo.progress``), fenced like the other
        writes of a claim: only where the task is RUNNING, held by the claim's worker under
        its token. Returns how many were stored (the others' claims were no longer held)."""

    @abc.abstractmethod
    def expire_claim(self, claim: Claim) -> Transition | None:
        """A claimed, unstarted task past its deadline -> TIMEOUT without starting it."""

    @abc.abstractmethod
    def release(self, claims: Sequence[Claim]) -> int:
        """Hand unstarted claims back to the queue; no attempt is counted."""

    @abc.abstractmethod
    def handler_returned(self, claims: Sequence[Claim]) -> int:
        """The handlers of these claims returned (or raised) after their tasks became terminal
        without them: a TIMEOUT while the handler ran, whose holder kept the lease
        (``expire_overdue``). Each such lease still held under the claim's token is let go
        and the task has *ended* now, atomically: its dependents are released or cancelled
        and it counts in its batch (both left for this moment by the TIMEOUT), and from then
        on a unique key, an overlap check, max_concurrency, a manual retry and the purge no
        longer wait for it. Other claims change nothing. The master does the same for a lease
        that lapsed instead (``recover_expired``). Returns how many ended so."""

    # -- operating ------------------------------------------------------------------------
    @abc.abstractmethod
    def cancel(self, task_id: str) -> CancelResult:
        """CREATED/PENDING -> CANCELLED; RUNNING -> cancel_requested; terminal -> unchanged."""

    def retry_plain(self, task_ids: Sequence[str]) -> tuple[list[Transition], list[str]]:
        """``retry`` of many tasks at once (the bulk actions), for those of ``task_ids`` that
        need nothing but their own reset: in a retryable status, no dependencies, no batch,
        no lease held, no ``from_step``. Atomic per task, as ``retry``. Returns the
        transitions of the tasks retried, and the ids left for ``retry`` one at a time (every
        other one: it says why it refuses). The default leaves them all to ``retry``."""
        return [], list(task_ids)

    @abc.abstractmethod
    def retry(self, task_id: str, from_step: str | None = None) -> Transition | None:
        """FAILED/TIMEOUT/ERROR/CANCELLED -> PENDING due now, fresh retry budget and deadline,
        any outstanding claim fenced off. None when the status forbids it. With
        ``from_step``, the task's checkpoints of that step and of every step that finished
        after it are deleted in the same atomic step (a refused retry deletes none); a step
        with no stored checkpoint raises UnknownStepError, changing nothing. Raises
        AttemptStillRunningError while the previous attempt's holder still holds its lease
        (a timed-out handler still running): a retry then would run the task twice at once.
        A dependent (``depends_on``) is decided against its dependencies in the same atomic
        step (dependencies.awaited_on_retry): one not ended is waited for again (CREATED,
        unclaimable, ``waiting_for`` set, released by its ending as after a submit); one that
        ended otherwise than COMPLETED raises DependencyNotCompletedError unless the
        dependent runs on failure; all ended: PENDING due now."""

    # -- paused queues --------------------------------------------------------------------
    @abc.abstractmethod
    def pause_queue(self, queue: str) -> bool:
        """Store ``queue`` as paused: from then on no claim, by any worker, takes a task of it
        (the claim reads the paused queues atomically with what it takes). Claims already
        made, running tasks, submits and schedule fires into it are left alone. True when
        paused now, False when it already was."""

    @abc.abstractmethod
    def resume_queue(self, queue: str) -> bool:
        """Forget the pause of ``queue`` and wake the idle workers waiting on it. True when it
        was paused, False when it was not (nothing changes)."""

    @abc.abstractmethod
    def paused_queues(self) -> set[str]:
        """The queues paused now."""

    # -- master-only chores (idempotent, batch-bounded) -----------------------------------
    def promote_due(self, limit: int) -> int:
        """Make due scheduled tasks claimable. A no-op where due tasks are claimable as is."""
        return 0

    def deliver_messages(self, limit: int) -> int:
        """Deliver up to ``limit`` messages a storage keeps between the parts of its state that
        no single write spans (the shards of a sharded Redis: a dependency or batch member
        ending on one shard, whose dependent or batch is on another), each applied once however
        often delivered. Returns how many were delivered. A no-op where one write spans it all."""
        return 0

    def settle_waits(self, limit: int) -> int:
        """Look again at up to ``limit`` durable waits for tasks (``context.wait_for``) whose
        awaited tasks live in another part of the store (the shards of a sharded Redis), and
        wake those whose tasks ended unseen (an ending between the wait's link and its
        suspend, while the suspend's own check could not reach that shard). Returns how many
        waits it looked at. A no-op where one write spans it all."""
        return 0

    @abc.abstractmethod
    def recover_expired(self, limit: int) -> list[Transition]:
        """Claims whose lease expired: unstarted ones go back to the queue (no attempt);
        started ones count a failed attempt ("worker lost") and retry or fail. A task that
        timed out while its handler ran, whose lease lapsed (its worker is gone), ends as
        ``handler_returned`` ends it (no transition returned: its status stays)."""

    @abc.abstractmethod
    def expire_overdue(self, limit: int) -> list[Transition]:
        """Non-terminal tasks past their max-duration deadline -> TIMEOUT. A RUNNING one keeps
        its holder's lease: the worker's heartbeat renews it while the handler still runs
        (threads cannot be stopped), it counts against max_concurrency, and ``retry`` is
        refused until the lease is let go or lapses. It has not *ended*: its dependents,
        its batch, its unique key and its schedule's overlap check wait for
        ``handler_returned`` or the lease's recovery."""

    def purge_finished(
        self,
        finished_before: dt.datetime,
        limit: int,
        statuses: frozenset[TaskStatus] | None = None,
    ) -> int:
        """Delete up to ``limit`` terminal tasks (of ``statuses``, default any terminal one)
        finished before the given time. Only finished tasks are ever purged: a status that
        is not terminal selects nothing."""
        return self._purge_finished(finished_before, limit, purged_statuses(statuses))

    @abc.abstractmethod
    def _purge_finished(
        self, finished_before: dt.datetime, limit: int, statuses: frozenset[TaskStatus]
    ) -> int:
        """``purge_finished`` of these terminal ``statuses`` (maybe none)."""

    def mark_limited(self, names: Collection[str], limit: int) -> int:
        """Where the storage keeps the waiting tasks of limited names apart (the database
        storage), put right, for up to ``limit`` tasks each way, which are kept apart: those of
        the names in ``names`` (``flow_limits.names()``: claimed one name at a time), and no others.
        Needed after a name gained or lost its limits, or when a task was stored by a process
        that did not know them. How many tasks changed (0 on storages that keep none apart)."""
        return 0

    def wait_for_work(self, queues: Sequence[str], timeout: float) -> bool:
        """Block up to ``timeout`` seconds until work may have arrived (only where
        ``blocking_wait``). True when woken early."""
        raise NotImplementedError

    def server_warnings(self) -> builtins.list[str]:
        """Problems of the server's configuration worth a warning when a worker starts."""
        return []

    def check_layout(self) -> None:  # noqa: B027 - optional, only Redis has layouts
        """Raise ImproperlyConfigured when this process's layout of the stored tasks is not
        the one the others use (Redis: REDIS_SHARDS against the recorded one, recorded here
        when none is). A worker calls it before it starts."""

    def wake(self, queues: Sequence[str]) -> None:  # noqa: B027 - optional, polling needs none
        """Let a worker blocked in wait_for_work on these queues return now."""

    def stop_waiting(self) -> None:  # noqa: B027 - optional, most waits hold nothing
        """Release what wait_for_work holds for the calling thread (a LISTEN connection)."""

    @abc.abstractmethod
    def has_work(self, queues: Sequence[str], horizon_seconds: float) -> bool:
        """True while a task of these queues is running or due within ``horizon_seconds``."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections held by this storage object."""
