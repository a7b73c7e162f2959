"""Test helpers: run due tasks in the test's own thread and transaction, on every storage.

``run_tasks()`` does what a worker does with each due task (claim, start, call the handler,
record its outcome, announce the signals) through the same storage transitions, but in the
calling thread and on its database connection: inside ``django.test.TestCase`` it sees the
tasks the test submitted in its open transaction, and what it writes is rolled back with the
test. A worker (``runexecutor``) cannot run there: its threads use connections of their own,
which never see that transaction's rows and wait for its locks.

``TaskTestMixin`` (for TestCase classes) and the pytest fixture ``reliable_tasks``
(``pytest_plugins = ["django_reliable_executor.testing"]``) give each test Redis keys of its
own (on the database storage the test's rollback already does), so no test runs another's
tasks.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast

from django.test.utils import override_settings

from .conf import get_settings
from .core.progress import Progress
from .core.records import Claim, TaskInfo
from .exceptions import storage_unavailable
from .registry import key_limits, name_limits, rate_limits
from .service.on_commit import pending_task_writes
from .service.reliable_executor import executor
from .worker.completion_writer import CompletionWriter
from .worker.runner import TaskRunner

if TYPE_CHECKING:
    from .storage.redis import RedisStorage

__all__ = ["TaskTestMixin", "reliable_tasks", "run_tasks"]

# Tasks claimed per round with until_idle=False (all that are due at the call, in practice).
_ONE_PASS = 1000
# A bound on the rounds of until_idle=True without a limit: a task that fails and is retried
# at once forever (retry_interval 0, a huge retry_limit) ends the call instead of hanging it.
_MOST_RUNS = 10_000


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
    ``max_concurrency`` are left waiting, as a worker would leave them.

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
    stored = executor.storage.get_many(list(ran))
    return [stored[task_id] for task_id in ran if task_id in stored]


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
