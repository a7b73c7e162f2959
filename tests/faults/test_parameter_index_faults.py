"""The parameter index (SEARCHABLE_PARAMETERS) under lost connections: a submit_many whose
connection dies mid-way (or whose Redis is killed) stores each task with its index entries or
nothing, never one without the other; ``executor index-parameters`` interrupted the same way
and run again leaves every task found by its parameter exactly once; a count by parameter
(bulk actions) fails clearly or counts right, and the next one counts right.

The databases' fault is the server ending the session the call runs on (pg_terminate_backend,
KILL CONNECTION), sent from a connection of its own just before a chosen statement of the call
(Django's execute_wrapper), so it lands at a known point inside the transaction; SQLite, which
has no server, loses the connection's handle there instead. Redis is a spare server (AOF,
``appendfsync always``) SIGKILLed and started again on the same port and data."""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.signals import request_started
from django.db import connections

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.core.parameter_index import index_entries
from django_reliable_executor.exceptions import storage_unavailable
from django_reliable_executor.models import ReliableTaskParameter
from django_reliable_executor.service import bulk_actions
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.service.reliable_executor import executor as module_executor
from django_reliable_executor.storage.database.parameter_rows import keeps_rows
from django_reliable_executor.storage.redis.scripts import source
from tests.conftest import REDIS_SHARDS, SERVERS, db_params, new_storage, require
from tests.support.redis_support import index_problems

pytest_plugins = ["tests.support.redis_servers"]  # spare_redis

KEYS = ("customer_id", "batch")
VALUES = 7  # customer_id takes VALUES values, so a search finds a seventh of the tasks
PREFIX = "pidx-faults"  # the key prefix on a spare Redis (no other test uses that server)
# Statements of the database storage, as the fault helper matches them.
TASK_INSERT = r"INSERT INTO \W?reliable_executor_task\W"
ROW_INSERT = r"INSERT (?:OR IGNORE |IGNORE )?INTO \W?reliable_executor_task_param\W"
COUNT = r"COUNT\("
STEP_LINE = re.compile(r"^  (\d+) tasks, up to (\S+)$")  # index-parameters -v 2, per step
TOTALS = re.compile(r"(\d+) tasks read: (\d+) index rows written, (\d+) deleted")


def parameter(n: int) -> dict[str, Any]:
    return {"customer_id": n % VALUES, "batch": "b1", "n": n}


def task_ids(count: int) -> list[str]:
    return [f"ix-{n:05d}" for n in range(count)]


def number(task_id: str) -> int:
    return int(task_id.split("-")[1])


def requests(count: int) -> list[TaskSubmitRequest]:
    return [
        TaskSubmitRequest("demo.echo", parameter(number(t)), task_id=t) for t in task_ids(count)
    ]


def searchable(settings, **more: Any) -> None:
    """KEYS searchable for the services (and the command) of this test, with ``more``."""
    settings.RELIABLE_EXECUTOR = {
        **settings.RELIABLE_EXECUTOR,
        "SEARCHABLE_PARAMETERS": KEYS,
        **more,
    }


def found(service: ReliableExecutor, **pairs: Any) -> list[str]:
    """The ids an indexed search of ``pairs`` lists, every page of it."""
    return [t.task_id for t in service.list_tasks(parameter=pairs, limit=100_000)]


def check_found(service: ReliableExecutor, ids: list[str]) -> set[str]:
    """The tasks of ``ids`` stored now; asserts that a search by each of their parameters finds
    exactly them, each once (and nothing of the tasks not stored)."""
    stored = set(service.storage.get_many(ids))
    every = found(service, batch="b1")
    assert len(every) == len(set(every)), "a task listed twice"
    assert set(every) == stored, (len(every), len(stored))
    for value in range(VALUES):
        matches = found(service, customer_id=value)
        wanted = {t for t in stored if number(t) % VALUES == value}
        assert len(matches) == len(set(matches)) and set(matches) == wanted, value
    return stored


def check_rows(alias: str, stored: set[str]) -> None:
    """On a database keeping index rows: exactly the rows of the stored tasks' entries."""
    if not keeps_rows(connections[alias].vendor):
        return
    rows = ReliableTaskParameter.objects.using(alias).values_list("task_id", "key", "value")
    listed = list(rows)
    assert len(listed) == len(set(listed))
    wanted = {(t, k, v) for t in stored for k, v in index_entries(parameter(number(t)), KEYS)}
    assert set(listed) == wanted, (len(listed), len(wanted))


# -- the databases' fault -------------------------------------------------------------------
def _end_session(alias: str, wrapper: Any) -> None:
    """End the server session of ``wrapper`` (a connection of ``alias``) from another one,
    and wait until the server has dropped it; SQLite: close the handle under Django."""
    raw = wrapper.connection
    if wrapper.vendor == "sqlite":
        raw.close()  # its open transaction is rolled back, as a lost session's is
        return
    host, port = SERVERS[alias]
    deadline = time.monotonic() + 10
    if wrapper.vendor == "postgresql":
        import psycopg

        pid = raw.info.backend_pid
        with psycopg.connect(
            host=host, port=port, user="postgres", dbname="postgres", autocommit=True
        ) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
                assert time.monotonic() < deadline, "the session outlived its termination"
                time.sleep(0.01)
        return
    import MySQLdb

    session = raw.thread_id()
    admin = MySQLdb.connect(host=host, port=port, user="root")
    try:
        cursor = admin.cursor()
        cursor.execute(f"KILL CONNECTION {int(session)}")
        while True:
            cursor.execute("SELECT 1 FROM information_schema.processlist WHERE id = %s", [session])
            if not cursor.fetchall():
                break
            assert time.monotonic() < deadline, "the session outlived its KILL"
            time.sleep(0.01)
    finally:
        admin.close()


@contextlib.contextmanager
def session_lost(alias: str, pattern: str, nth: int = 1) -> Iterator[list[str]]:
    """In this thread, the connection to ``alias`` lost just before the ``nth`` statement
    matching ``pattern`` is sent (which then meets the dead session). Yields the list of the
    statements it was lost before: empty if the statement never came."""
    lost: list[str] = []
    seen = 0

    def wrapper(execute, sql, params, many, context):
        nonlocal seen
        if not lost and re.search(pattern, sql):
            seen += 1
            if seen == nth:
                lost.append(sql[:80])
                _end_session(alias, context["connection"])
        return execute(sql, params, many, context)

    with connections[alias].execute_wrapper(wrapper):
        yield lost


# -- Redis's fault ----------------------------------------------------------------------------
def kill_on_command(server, wanted: Callable[[str], bool]) -> threading.Thread:
    """A thread that SIGKILLs ``server`` as soon as its MONITOR shows a client's command (not
    a script's own) that ``wanted`` accepts."""
    ready = threading.Event()

    def watch() -> None:
        with contextlib.suppress(Exception), server.client().monitor() as monitor:
            ready.set()
            for line in monitor.listen():
                if line.get("client_type") != "lua" and wanted(line["command"]):
                    server.kill()
                    return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(10)
    return thread


def aof_server(spare_redis):
    return spare_redis("--appendonly", "yes", "--appendfsync", "always")


# -- 1. submit_many --------------------------------------------------------------------------
TASKS = 1200  # three INSERTs of tasks (500 rows each), five of index rows (two keys a task)


@pytest.mark.parametrize(
    ("alias", "before"),
    [
        *[
            pytest.param(p.values[0], "tasks", id=f"{p.id}-before-tasks-insert-2", marks=p.marks)
            for p in db_params(["default", "mariadb", "postgres"])
        ],
        # (PostgreSQL writes no rows: its GIN index answers)
        *[
            pytest.param(p.values[0], "rows", id=f"{p.id}-before-rows-insert-2", marks=p.marks)
            for p in db_params(["default", "mariadb"])
        ],
    ],
)
def test_a_submit_whose_session_is_lost_stores_nothing_and_no_index_row(settings, alias, before):
    require(alias)
    searchable(settings)
    service = ReliableExecutor(new_storage(alias, PREFIX))
    pattern = TASK_INSERT if before == "tasks" else ROW_INSERT
    with session_lost(alias, pattern, nth=2) as lost, pytest.raises(Exception) as raised:
        service.submit_many(requests(TASKS))
    assert lost, "the statement the session was to be lost before never came"
    print(f"{alias}: lost before {lost[0]!r}: {type(raised.value).__name__}: {raised.value}")
    # The database's own error, which says the storage was out of reach (SQLite's closed
    # handle is a ProgrammingError: a server could not be lost there).
    assert alias == "default" or storage_unavailable(raised.value), raised.value
    # One transaction (docs/redis.md: submit_many on a database): nothing of it is kept, the
    # first span's tasks and rows written before the loss included.
    ids = task_ids(TASKS)
    assert check_found(service, ids) == set()
    check_rows(alias, set())
    # Submitted again (a new session): every task, each with its entries.
    service.submit_many(requests(TASKS))
    assert check_found(service, ids) == set(ids)
    check_rows(alias, set(ids))


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_a_submit_whose_redis_is_killed_stores_each_task_with_its_entries(
    settings, alias, spare_redis
):
    searchable(settings)
    server = aof_server(spare_redis)
    storage = new_storage("redis", PREFIX, redis_url=server.url)
    service = ReliableExecutor(storage)
    count = 2000  # four scripts of 500 tasks (submit.lua stores a task and its entries at once)
    ids = task_ids(count)
    # Killed as the second submit script is sent (sharded, after the id reservations): the
    # first is stored, the last ones never run.
    submit_sha = hashlib.sha1(source("submit").encode(), usedforsecurity=False).hexdigest()
    scripts = itertools.count(1)

    def second_submit(command: str) -> bool:
        return command.startswith(f"EVALSHA {submit_sha}") and next(scripts) == 2

    watcher = kill_on_command(server, second_submit)
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        service.submit_many(requests(count))
    watcher.join(10)
    assert not server.running
    assert storage_unavailable(raised.value), raised.value
    server.start()  # the AOF replayed: every script acknowledged before the kill, no other
    stored = check_found(service, ids)
    print(f"redis: {len(stored)} of {count} tasks stored ({time.monotonic() - started:.2f} s)")
    assert 0 < len(stored) < count, "the kill did not land during the submit"
    assert index_problems(storage) == []  # no entry without its task, no task off its sets
    service.submit_many(requests(count))  # the same batch again: the rest stored
    assert check_found(service, ids) == set(ids)
    assert index_problems(storage) == []
    storage.close()


# -- 2. executor index-parameters ------------------------------------------------------------
OLDER = 500  # tasks stored before KEYS were searchable
CHUNK = 100


class Output(io.StringIO):
    """The command's stdout: calls ``fault`` once it has printed its ``after``-th step."""

    def __init__(self, after: int = 0, fault: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.after, self.fault, self.steps = after, fault, 0

    def write(self, text: str) -> int:
        written = super().write(text)
        if STEP_LINE.match(text.rstrip("\n")):
            self.steps += 1
            if self.steps == self.after and self.fault is not None:
                self.fault()
        return written

    def positions(self) -> list[str]:
        return [m.group(2) for line in self.getvalue().splitlines() if (m := STEP_LINE.match(line))]

    def totals(self) -> tuple[int, int, int]:
        match = TOTALS.search(self.getvalue())
        assert match, self.getvalue()
        return int(match.group(1)), int(match.group(2)), int(match.group(3))


def index_parameters(*args: str, out: Output | None = None) -> Output:
    out = out if out is not None else Output()
    call_command(
        "executor", "index-parameters", "--chunk", str(CHUNK), *args, stdout=out, verbosity=2
    )
    return out


RESUMES = ["after", "again"]  # from the last step printed (--after), or from the start


@pytest.mark.parametrize("resume", RESUMES)
@pytest.mark.parametrize("alias", db_params(["default", "mariadb"]))
def test_index_parameters_interrupted_by_a_lost_session_ends_whole(settings, alias, resume):
    require(alias)
    ids = task_ids(OLDER)
    ReliableExecutor(new_storage(alias, PREFIX)).submit_many(requests(OLDER))  # no key yet
    searchable(settings, DATABASE_ALIAS=alias)
    service = ReliableExecutor(new_storage(alias, PREFIX))
    assert found(service, batch="b1") == []
    out = Output()
    try:
        # Lost in the third step, between its reads and its INSERT of the missing rows.
        with session_lost(alias, ROW_INSERT, nth=3) as lost, pytest.raises(Exception) as raised:
            index_parameters(out=out)
        assert lost
        print(f"{alias}: {type(raised.value).__name__}: {raised.value}")
        printed = out.positions()
        assert printed == [ids[CHUNK - 1], ids[2 * CHUNK - 1]], out.getvalue()
        # The two steps done are kept whole, the third left nothing.
        check_rows(alias, set(ids[: 2 * CHUNK]))
        if resume == "after":
            left = OLDER - 2 * CHUNK
            assert index_parameters("--after", printed[-1]).totals() == (left, 2 * left, 0)
        else:
            assert index_parameters().totals() == (OLDER, 2 * (OLDER - 2 * CHUNK), 0)
        assert check_found(service, ids) == set(ids)
        check_rows(alias, set(ids))
        assert index_parameters().totals() == (OLDER, 0, 0)  # a second run changes nothing
        check_rows(alias, set(ids))
    finally:
        module_executor.storage.close()


@pytest.mark.parametrize("resume", RESUMES)
@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_index_parameters_interrupted_by_a_killed_redis_ends_whole(
    settings, alias, spare_redis, resume
):
    server = aof_server(spare_redis)
    storage = new_storage("redis", PREFIX, redis_url=server.url)
    ids = task_ids(OLDER)
    ReliableExecutor(storage).submit_many(requests(OLDER))  # no key searchable yet
    searchable(
        settings,
        STORAGE="redis",
        REDIS_URL=server.url,
        KEY_PREFIX=PREFIX,
        REDIS_SHARDS=REDIS_SHARDS,
    )
    service = ReliableExecutor(storage)
    assert found(service, batch="b1") == []
    out = Output(after=2, fault=server.kill)  # killed once two steps are done
    try:
        with pytest.raises(Exception) as raised:
            index_parameters(out=out)
        # The command says so (a CommandError: exit code and message, no traceback).
        assert "cannot be reached" in str(raised.value), raised.value
        printed = out.positions()
        assert len(printed) == 2, out.getvalue()
        server.start()  # the AOF replayed: both steps' scripts are there
        assert index_problems(storage) == []
        if resume == "after":
            index_parameters("--after", printed[-1])
        else:
            index_parameters()
        missing = sorted(set(ids) - set(found(service, batch="b1")))
        assert not missing, f"{len(missing)} tasks never indexed, e.g. {missing[:5]}"
        assert check_found(service, ids) == set(ids)
        assert index_problems(storage) == []
        read, written, deleted = index_parameters().totals()  # a second run changes nothing
        assert read >= OLDER and (written, deleted) == (0, 0), (read, written, deleted)
    finally:
        module_executor.storage.close()
        storage.close()


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_index_parameters_over_a_redis_restarted_between_two_steps_reaches_every_task(
    settings, alias, spare_redis
):
    # Restarted at once (a crash and a supervisor's restart, or a failover): the client's
    # retry reconnects, so the walk goes on by itself, and must still reach every task.
    server = aof_server(spare_redis)
    storage = new_storage("redis", PREFIX, redis_url=server.url)
    ids = task_ids(OLDER)
    ReliableExecutor(storage).submit_many(requests(OLDER))  # no key searchable yet
    searchable(
        settings,
        STORAGE="redis",
        REDIS_URL=server.url,
        KEY_PREFIX=PREFIX,
        REDIS_SHARDS=REDIS_SHARDS,
    )
    service = ReliableExecutor(storage)
    restarted: list[str] = []

    def restart() -> None:
        before = server.client().info("server")["run_id"]
        server.restart(hard=True)  # SIGKILL, then the same port and AOF
        restarted.append(server.client().info("server")["run_id"])
        assert restarted[-1] != before

    try:
        out = index_parameters(out=Output(after=2, fault=restart))
        assert restarted, out.getvalue()
        print(out.getvalue().splitlines()[-1])
        missing = sorted(set(ids) - set(found(service, batch="b1")))
        assert not missing, f"{len(missing)} tasks never indexed, e.g. {missing[:5]}"
        assert check_found(service, ids) == set(ids)
        assert index_problems(storage) == []
    finally:
        module_executor.storage.close()
        storage.close()


# -- 3. count_tasks by parameter (a bulk action's count) -------------------------------------
def count(service: ReliableExecutor, value: int) -> int:
    return bulk_actions.count_matching(service, {"parameter": {"customer_id": value}})


COUNTED = 300


@pytest.mark.parametrize("alias", db_params(["mariadb", "postgres"]))
def test_a_count_whose_session_is_lost_fails_clearly_and_the_next_counts(settings, alias):
    require(alias)
    searchable(settings)
    service = ReliableExecutor(new_storage(alias, PREFIX))
    service.submit_many(requests(COUNTED))
    right = len([t for t in task_ids(COUNTED) if number(t) % VALUES == 3])
    assert count(service, 3) == right
    with session_lost(alias, COUNT) as lost:
        try:
            answered: int | Exception = count(service, 3)
        except Exception as exc:  # noqa: BLE001 - which one is what is checked
            answered = exc
    assert lost
    print(f"{alias}: the count during the loss: {answered!r}")
    if isinstance(answered, Exception):
        assert storage_unavailable(answered), answered
    else:
        assert answered == right
    # The next call, in the next request (the admin's count page runs in one: Django closes
    # a connection an error left unusable as a request starts), on a new session.
    request_started.send(sender=None)
    assert count(service, 3) == right
    assert count(service, 4) == len([t for t in task_ids(COUNTED) if number(t) % VALUES == 4])


@pytest.mark.parametrize("alias", db_params(["redis"]))
def test_a_count_while_redis_is_down_fails_clearly_and_the_next_counts(
    settings, alias, spare_redis
):
    searchable(settings)
    server = aof_server(spare_redis)
    storage = new_storage("redis", PREFIX, redis_url=server.url)
    service = ReliableExecutor(storage)
    service.submit_many(requests(COUNTED))
    right = len([t for t in task_ids(COUNTED) if number(t) % VALUES == 3])
    assert count(service, 3) == right
    server.kill()
    with pytest.raises(Exception) as raised:
        count(service, 3)
    assert storage_unavailable(raised.value), raised.value
    server.start()
    assert count(service, 3) == right  # the same storage: its client connects again
    storage.close()
