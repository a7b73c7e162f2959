"""Test helpers: run due tasks in the test's own thread and transaction, on every storage.

``run_tasks()`` does what a worker does with each due task (claim, start, call the handler,
record its outcome, announce the signals) through the same storage transitions, but in the
calling thread and on its database connection: inside ``django.test.TestCase`` it sees the
tasks the test submitted in its open transaction, and what it writes is rolled back with the
test. A worker (``runexecutor``) cannot run there: its threads use connections of their own,
which never see that transaction's rows and wait for its locks.

Due tasks it leaves waiting because a rate limit, a concurrency cap or a paused queue holds
them back (as a worker would) are named in a ``TasksHeldBackWarning``: a test that expected
them to run learns why they did not.

``TaskTestMixin`` (for TestCase classes) and the pytest fixture ``reliable_tasks``
(``pytest_plugins = ["django_reliable_executor.testing"]``) give each test Redis keys of its
own (on the database storage the test's rollback already does), so no test runs another's
tasks.
"""

from __future__ import annotations

import contextlib
import copy
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from django.test.utils import override_settings

from .conf import get_settings
from .core.progress import Progress
from .core.records import Claim, TaskInfo
from .core.states import WAITING_STATUSES
from .exceptions import storage_unavailable
from .registry import get_handler, key_limits, name_limits, rate_limits, register
from .service.on_commit import pending_task_writes
from .service.reliable_executor import executor
from .worker.completion_writer import CompletionWriter
from .worker.runner import TaskRunner

if TYPE_CHECKING:
    from .storage.redis import RedisStorage

__all__ = [
    "TaskTestMixin",
    "TasksHeldBackWarning",
    "reliable_tasks",
    "run_tasks",
    "without_flow_limits",
]

# Tasks claimed per round with until_idle=False (all that are due at the call, in practice).
_ONE_PASS = 1000
# A bound on the rounds of until_idle=True without a limit: a task that fails and is retried
# at once forever (retry_interval 0, a huge retry_limit) ends the call instead of hanging it.
_MOST_RUNS = 10_000
# Most waiting tasks of one limited name read to tell which are held back (the warning's count).
_HELD_SCAN = 1000


class TasksHeldBackWarning(UserWarning):
    """``run_tasks()`` left due tasks waiting because a rate limit, a concurrency cap
    (``max_concurrency``, ``max_concurrency_per_key``) or a paused queue held them back, as a
    worker would. The message names each task name (or queue), how many, and why."""


def run_tasks(
    *,
    queues: Sequence[str] | None = None,
    limit: int | None = None,
    until_idle: bool = True,
) -> list[TaskInfo]:
    """Run due tasks synchronously in this thread; return the tasks run, in the order they
    ran, each as it stands now (a task run twice, retried, is listed once).

    ``queues``: only these (default: every queue that holds tasks). ``limit``: at most this
    many runs. ``until_idle``: keep going while tasks fall due (dependents released, batch
    callbacks stored, retries whose interval has passed); False: only the tasks due now.
    Tasks delayed into the future, of paused queues, or over their rate limit or
    ``max_concurrency`` are left waiting, as a worker would leave them; those that are due
    (all but the delayed ones) are named in a ``TasksHeldBackWarning``, unless ``limit``
    ended the call.

    On Redis, the submits the test made inside its open transaction (which a TestCase never
    commits) are stored first, as they would be at its commit."""
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ValueError(f"run_tasks: limit must be a positive int or None, got {limit!r}")
    if isinstance(queues, str):
        raise ValueError(f"run_tasks: queues must be a list of queue names, got {queues!r}")
    _store_deferred_submits()
    runner = _InlineRunner()
    most = limit if limit is not None else _MOST_RUNS
    ran: dict[str, None] = {}  # task ids, in the order they first ran
    runs = 0
    while runs < most:
        claims = runner.claim(queues, 1 if until_idle else min(most - runs, _ONE_PASS))
        if not claims:
            break
        for claim in claims:
            runner.run(claim)
            ran.setdefault(claim.task_id, None)
            runs += 1
        if not until_idle:
            break
    if runs < most:
        held = held_back(queues)
        if held:
            warnings.warn(held_back_message(held), TasksHeldBackWarning, stacklevel=2)
    stored = executor.storage.get_many(list(ran))
    return [stored[task_id] for task_id in ran if task_id in stored]


@contextlib.contextmanager
def without_flow_limits(*names: str) -> Iterator[None]:
    """Inside the block, the handlers of ``names`` have no ``rate_limit``,
    ``max_concurrency`` nor ``max_concurrency_per_key`` (their other options stay): a test
    that submits a backlog of a limited task and runs it with ``run_tasks()`` runs all of it.
    Submit and run inside the block: a task is stored for the limits its name had at submit.
    The registry's handlers are swapped (``register``, which forgets what it derived from
    them) and put back at the end. ValueError for a name with no handler registered."""
    originals = []
    for name in names:
        handler = get_handler(name)
        if handler is None:
            raise ValueError(f"without_flow_limits: no handler is registered as {name!r}")
        originals.append(handler)
    try:
        for handler in originals:
            lifted = copy.copy(handler)
            lifted.rate_limit = None
            lifted.max_concurrency = None
            lifted.max_concurrency_per_key = None
            register(lifted)  # the same function: replaces it
        yield
    finally:
        for handler in originals:
            register(handler)


def held_back(queues: Sequence[str] | None = None) -> list[tuple[str, int, str]]:
    """The due tasks of ``queues`` (None: every queue) that no claim takes now, grouped by
    why: ``(what, how many, why)`` for each paused queue and each task name whose rate limit
    or concurrency cap holds some back. One read per limited name registered (none without
    one), and one for the paused queues when there are some."""
    paused = executor.paused_queues()
    if queues is not None:
        paused &= set(queues)
    held = []
    if paused:  # only those holding a due task
        due_by_queue = executor.oldest_due_by_queue()
        held += [
            (f"queue {queue!r}", 0, "paused: resume_queue() lets it run")
            for queue in sorted(paused)
            if queue in due_by_queue
        ]
    now = executor.clock.now()
    # Redis moves a task held by its rate limit to when the window frees (its run_at is then
    # ahead): the storage's own count of them is taken as well.
    rate_held = {use.task_name: use.held_back for use in executor.rate_limit_use()}
    for name in sorted({*rate_limits(), *name_limits(), *key_limits()}):
        waiting = executor.list_tasks(statuses=WAITING_STATUSES, task_name=name, limit=_HELD_SCAN)
        ours = [
            task
            for task in waiting
            if (queues is None or task.queue in queues)
            and task.queue not in paused
            and not task.waiting_for
            and task.waiting is None
        ]
        due = sum(task.run_at <= now for task in ours)
        n = max(due, min(rate_held.get(name, 0), len(ours)))
        if n:
            held.append((name, n, _limits_of(name)))
    return held


def held_back_message(held: list[tuple[str, int, str]]) -> str:
    parts = [f"{what}: {n} held back by {why}" if n else f"{what}: {why}" for what, n, why in held]
    return (
        "run_tasks() left due tasks waiting, as a worker would: "
        + "; ".join(parts)
        + ". See 'Rate limits, caps and paused queues' in the testing docs for a way to run them."
    )


def _limits_of(name: str) -> str:
    """The limits of ``name``'s handler that can hold a due task back, as its decorator says."""
    handler = get_handler(name)
    if handler is None:
        return "its limits"
    limits = []
    if handler.rate_limit is not None:
        rate = handler.rate_limit
        per = {1.0: "s", 60.0: "m", 3600.0: "h"}.get(rate.window_seconds)
        window = per or f"{rate.window_seconds:g}s"
        limits.append(f'rate_limit="{rate.count}/{window}" (they start as its window frees)')
    if handler.max_concurrency is not None:
        limits.append(f"max_concurrency={handler.max_concurrency}")
    if handler.max_concurrency_per_key is not None:
        limits.append(f"max_concurrency_per_key={handler.max_concurrency_per_key}")
    return " or ".join(limits)


def _store_deferred_submits() -> None:
    """Redis: write now the submits that wait for the commit of a transaction open in this
    thread (taken off its on_commit list, so a commit later does not write them twice)."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            continue
        writes = pending_task_writes(connection.alias)
        if not writes:
            continue
        connection.run_on_commit = [
            entry for entry in connection.run_on_commit if entry[1] not in writes
        ]
        for write in writes:
            write()


class _InlineWriter:
    """The completion writer's part, in the calling thread: each result written at once."""

    def __init__(self, runner: _InlineRunner) -> None:
        self.runner = runner

    def put(self, claim: Claim, result: Any) -> None:
        runner = self.runner
        try:
            [transition] = runner.storage.complete_many([(claim, result)])
        except Exception as exc:
            if storage_unavailable(exc):
                raise
            transition = runner.refuse_result(claim, exc)
        if transition is None:
            runner.discarded(claim)
        else:
            runner.executor.announcer.transitions([transition])

    def held(self) -> list[Claim]:
        return []


class _InlineRunner(TaskRunner):
    """A TaskRunner whose every write happens in the calling thread: no completion writer,
    no progress writer, no heartbeat (the lease is LEASE_TIMEOUT; the call holds a claim only
    while its handler runs)."""

    def __init__(self) -> None:
        super().__init__(executor, get_settings().LEASE_TIMEOUT)
        self.worker_id = f"run_tasks-{uuid.uuid4().hex[:12]}"
        # Typed as the writer it stands in for: TaskRunner calls only put() and held().
        self.writer = cast(CompletionWriter, _InlineWriter(self))

    def claim(self, queues: Sequence[str] | None, limit: int) -> list[Claim]:
        storage = self.storage
        # What the master's round would have done by now: delayed tasks and retries that
        # are due become claimable (Redis keeps them apart until then), messages between
        # Redis shards delivered.
        storage.promote_due(_ONE_PASS)
        storage.deliver_messages(_ONE_PASS)
        names = list(queues) if queues is not None else sorted(storage.count_by_queue())
        if not names:
            return []
        claims = storage.claim(
            self.worker_id,
            names,
            limit,
            self.lease_seconds,
            name_limits=name_limits() or None,
            rate_limits=rate_limits() or None,
            key_limits=key_limits() or None,
        )
        self.claimed(claims)
        return claims

    def report_progress(self, claim: Claim, progress: Progress) -> None:
        self.storage.record_progress([(claim, progress)])

    def finish_progress(self, claim: Claim) -> None:
        """Nothing waits: each report was written when it was made."""

    def refuse_result(self, claim: Claim, exc: BaseException) -> Any:
        return self.failures.refuse_result(claim, exc)

    def discarded(self, claim: Claim) -> None:
        self.failures.discarded(claim)


class TaskTestMixin:
    """For ``django.test.TestCase`` (or ``TransactionTestCase``) classes: on Redis, each test
    stores its tasks under a key prefix of its own, deleted afterwards; on the database
    storage, nothing more (the test's rollback removes its tasks). Gives ``self.run_tasks``.
    A ``setUp`` of your own calls ``super().setUp()``, as with any mixin."""

    run_tasks = staticmethod(run_tasks)

    def setUp(self) -> None:  # noqa: N802 - unittest's name
        keys = _own_keys()
        keys.__enter__()
        self.addCleanup(keys.__exit__, None, None, None)  # type: ignore[attr-defined]
        super().setUp()  # type: ignore[misc]


def _own_keys() -> _RedisKeys | contextlib.nullcontext[None]:
    """A context in which the executor stores tasks apart from every other test's: on Redis,
    under a KEY_PREFIX of its own (its keys deleted at the end); on the databases, as it is."""
    return _RedisKeys() if get_settings().task_database is None else contextlib.nullcontext()


class _RedisKeys:
    """override_settings with a KEY_PREFIX of the test's own; its keys deleted afterwards."""

    def __init__(self) -> None:
        from django.conf import settings

        own = dict(getattr(settings, "RELIABLE_EXECUTOR", {}))
        own["KEY_PREFIX"] = f"{get_settings().KEY_PREFIX}-test-{uuid.uuid4().hex[:12]}"
        self.prefix = own["KEY_PREFIX"]
        self.override = override_settings(RELIABLE_EXECUTOR=own)

    def __enter__(self) -> None:
        self.override.__enter__()

    def __exit__(self, *exc: object) -> None:
        try:
            from .storage.redis.wiping import delete_every_key

            storage = executor.storage
            delete_every_key(cast("RedisStorage", storage))
            storage.close()
        finally:
            self.override.__exit__(None, None, None)


def _fixture(function: Callable[..., Iterator[Any]]) -> Any:
    """pytest's fixture decorator when pytest is importable (TestCase users import this
    module without having pytest)."""
    try:
        import pytest
    except ImportError:  # pragma: no cover - without pytest there is no fixture to offer
        return function
    return pytest.fixture(function)


@_fixture
def reliable_tasks() -> Iterator[Callable[..., list[TaskInfo]]]:
    """The pytest fixture: ``run_tasks``, with the test's tasks kept apart on Redis (a key
    prefix of its own). Enable it with ``pytest_plugins = ["django_reliable_executor.testing"]``
    in your conftest.py, and use it beside pytest-django's ``db`` (or ``transactional_db``)."""
    with _own_keys():
        yield run_tasks
