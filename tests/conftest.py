"""Shared fixtures: one storage per backend (SQLite, MariaDB, PostgreSQL, Redis), an injected
clock, service reachability.

A service that cannot be reached skips its tests locally and fails them under CI (CI=true).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from django_reliable_executor.core.clock import Clock, FakeClock
from django_reliable_executor.core.flow_limits import FlowLimits
from django_reliable_executor.registry import FLOW_LIMITS
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.base import TaskStorage
from django_reliable_executor.storage.database import DatabaseStorage
from django_reliable_executor.worker.worker import Worker, WorkerOptions
from tests.support.ci import IN_CI

if TYPE_CHECKING:
    from django_reliable_executor.storage.redis import RedisStorage

SERVERS = {
    "mariadb": (
        os.environ.get("RE_MARIADB_HOST", "127.0.0.1"),
        int(os.environ.get("RE_MARIADB_PORT", "3306")),
    ),
    "postgres": (
        os.environ.get("RE_POSTGRES_HOST", "127.0.0.1"),
        int(os.environ.get("RE_POSTGRES_PORT", "5432")),
    ),
    "redis": (
        os.environ.get("RE_REDIS_HOST", "127.0.0.1"),
        int(os.environ.get("RE_REDIS_PORT", "6379")),
    ),
}
DB_ALIASES = ["default", "mariadb", "postgres"]  # default is SQLite
# The contract suite's backends: the database aliases, and "redis" (whose tests still get the
# SQLite default database, for the demo app's tables and the callers' transactions).
BACKENDS = [*DB_ALIASES, "redis"]
REDIS_URL = "redis://{}:{}/0".format(*SERVERS["redis"])
# The shards of every Redis storage the tests build (RedisStorage's shards; 1: the layout of
# a single hash tag). Set to run the Redis tests over a sharded layout.
REDIS_SHARDS = int(os.environ.get("TEST_REDIS_SHARDS", "1"))
# The apps whose tables tests write; only these are flushed between tests (flushing every
# table of the test project cost about a second per test on PostgreSQL).
TASK_APPS = ["django_reliable_executor", "demo"]


def reachable(alias: str) -> bool:
    if alias not in SERVERS:
        return True
    try:
        with socket.create_connection(SERVERS[alias], timeout=1):
            return True
    except OSError:
        return False


def require(alias: str) -> None:
    """Skip locally, but never under CI, when the alias's server is down."""
    if not reachable(alias) and not IN_CI:
        pytest.skip(f"{alias} server not reachable (runs under CI=true)")


def db_params(aliases: list[str] | None = None) -> list:
    """pytest params for each backend, marked for a transactional test database."""
    return [
        pytest.param(
            alias,
            id="sqlite" if alias == "default" else alias,
            marks=pytest.mark.django_db(
                transaction=True,
                databases=["default" if alias == "redis" else alias],
                available_apps=TASK_APPS,
            ),
        )
        for alias in (aliases or DB_ALIASES)
    ]


@pytest.fixture(params=db_params(BACKENDS))
def alias(request: pytest.FixtureRequest) -> str:
    """The backend under test: a database alias, or "redis"."""
    require(request.param)
    return request.param


@pytest.fixture
def db_alias(alias: str) -> str:
    """The database holding the demo app's tables (and the callers' transactions)."""
    return "default" if alias == "redis" else alias


def redis_client(url: str = REDIS_URL):
    import redis

    return redis.Redis.from_url(url, decode_responses=True)


def delete_prefix(client, key_prefix: str) -> None:
    """Delete every key of one key prefix (never FLUSHALL: the server is shared)."""
    # "{prefix}:..." and, when a test stored under REDIS_SHARDS > 1, its shards'
    # "{prefix:shard-N}:...", in one pass (each pass reads all the server's keys).
    keys = list(client.scan_iter(match="{" + key_prefix + "[}:]*", count=10_000))
    for start in range(0, len(keys), 500):
        client.delete(*keys[start : start + 500])


@contextlib.contextmanager
def own_key_prefix(on_redis: bool, name: str = "test") -> Iterator[str]:
    """A key prefix no other test uses; its keys on the shared Redis are deleted afterwards
    (``on_redis``: only a test on Redis wrote any)."""
    prefix = f"{name}-{uuid.uuid4().hex[:12]}"
    try:
        yield prefix
    finally:
        if on_redis:
            client = redis_client()
            delete_prefix(client, prefix)
            client.close()


@contextlib.contextmanager
def sharded_redis_storage(name: str, shards: int, clock: Clock) -> Iterator[RedisStorage]:
    """A Redis storage of ``shards`` shards on the shared Redis, under a key prefix of its own
    (``name``-…); closed, and every shard's keys deleted, afterwards."""
    from django_reliable_executor.storage.redis import RedisStorage

    require("redis")
    with own_key_prefix(True, name) as prefix:
        made = RedisStorage(
            redis_client(), prefix, clock=clock, shards=shards, flow_limits=FLOW_LIMITS
        )
        try:
            yield made
        finally:
            made.close()


def start_warnings(executor: ReliableExecutor, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings a worker over ``executor`` logs when it starts (it is stopped at once)."""
    worker = Worker(WorkerOptions(poll_interval=0.05), executor)
    thread = threading.Thread(target=worker.run)
    with caplog.at_level(logging.WARNING, logger="django_reliable_executor"):
        thread.start()
        worker.request_stop()
        thread.join(10)
    assert not thread.is_alive()
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def new_storage(
    alias: str,
    key_prefix: str,
    *,
    clock: Clock | None = None,
    backoff_cap_millis: int | None = None,
    redis_url: str = REDIS_URL,
    shards: int = REDIS_SHARDS,
    flow_limits: FlowLimits = FLOW_LIMITS,
) -> TaskStorage:
    """The one storage builder of the tests: over a database alias, or over Redis ("redis")
    under ``key_prefix`` (``shards``: its REDIS_SHARDS), told the registry's limited names
    (``FLOW_LIMITS``, as the service's own storage is) unless given others. Without
    ``backoff_cap_millis`` each storage keeps its own default (the database one reads the
    settings). Close a Redis storage when done."""
    if alias == "redis":
        from django_reliable_executor.storage.redis import RedisStorage

        if backoff_cap_millis is None:
            return RedisStorage(
                redis_client(redis_url),
                key_prefix,
                clock=clock,
                shards=shards,
                flow_limits=flow_limits,
            )
        return RedisStorage(
            redis_client(redis_url),
            key_prefix,
            clock=clock,
            backoff_cap_millis=backoff_cap_millis,
            shards=shards,
            flow_limits=flow_limits,
        )
    return DatabaseStorage(
        alias=alias, clock=clock, backoff_cap_millis=backoff_cap_millis, flow_limits=flow_limits
    )


@pytest.fixture
def key_prefix(alias: str) -> Iterator[str]:
    """A key prefix of this test's own on the shared Redis, deleted afterwards."""
    with own_key_prefix(alias == "redis") as prefix:
        yield prefix


@pytest.fixture(autouse=True)
def _clear_hooks():
    """Per-task behaviour set by contract tests (tests/support/contract_support.py) never leaks."""
    from tests.support.contract_support import HOOKS

    HOOKS.clear()
    yield
    HOOKS.clear()


@pytest.fixture(scope="session", autouse=True)
def _remove_wake_marker() -> Iterator[None]:
    """The SQLite test database's wake-up marker file (storage/database/waiting.py) outlives the
    database file Django deletes at the end: remove it too."""
    yield
    from django.db import connections

    test_name = connections["default"].settings_dict["TEST"].get("NAME")
    if test_name:
        with contextlib.suppress(OSError):
            os.remove(f"{test_name}-executor-wake")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_storage(alias: str, key_prefix: str) -> Iterator[Callable[..., TaskStorage]]:
    """Builds storage objects on the backend under test (one per thread, like workers do)."""
    made: list[TaskStorage] = []

    def make(clock: FakeClock | None = None, flow_limits: FlowLimits = FLOW_LIMITS) -> TaskStorage:
        storage = new_storage(
            alias, key_prefix, clock=clock, backoff_cap_millis=300000, flow_limits=flow_limits
        )
        made.append(storage)
        return storage

    yield make
    for storage in made:
        if alias == "redis":
            storage.close()


@pytest.fixture
def storage(make_storage: Callable[..., TaskStorage], clock: FakeClock) -> TaskStorage:
    return make_storage(clock)


@pytest.fixture
def executor(storage: TaskStorage, clock: FakeClock) -> ReliableExecutor:
    """A service over the test storage and the fake clock."""
    return ReliableExecutor(storage, clock=clock)


@pytest.fixture
def workers(tmp_path):
    """Starts ``runexecutor`` subprocesses (tests/support/processes.py); kills every leftover at
    teardown, before the test database is flushed."""
    from tests.support.processes import Workers

    started = Workers(tmp_path)
    yield started
    started.kill_all()


# Tox's Django 6.0 env (RE_DJANGO_VERSION_SUBSET=1) runs what Django's version can change; what
# does not runs once, in the Django 5.2 env (CI time, tox.ini says which): the fault suite, the
# model-based test, the Redis scripts, and tests/races/ (the process tests that race workers
# against each other, and the ended matrix: real workers on every storage, what it races is the
# storages' own writes). tests/process/ holds the ones that exercise Django's own signal and
# async paths: they run on every Django. tests/integration/flow_control/ (caps, keys, rates,
# fairness, debounce: the storages' own SQL and Lua, which the contract suite's runs on every
# Django reach through the same ORM calls) runs once too (CI time).
_ONCE_ONLY_DIRS = {
    ("faults",),
    ("model",),
    ("races",),
    ("redis", "scripts"),
    ("integration", "flow_control"),
}


# The admin's browser tests (Chromium) run on the oldest and the newest Django the matrix has
# (5.2 and 6.1, whose admin markup differs), not again on 6.0 (CI time).
_BROWSER_TESTS = "test_admin_browser"


def pytest_ignore_collect(collection_path, config) -> bool | None:
    if os.environ.get("RE_DJANGO_VERSION_SUBSET") != "1":
        return None
    parts = collection_path.parts
    if "tests" not in parts:
        return None
    below = parts[parts.index("tests") + 1 :]
    if any(below[: len(folder)] == folder for folder in _ONCE_ONLY_DIRS):
        return True
    if collection_path.name.startswith(_BROWSER_TESTS):
        return True
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logreport(report) -> None:
    """Under pytest-xdist a worker sends each report to the controller as UTF-8: the tests of
    text no store can hold capture log lines with lone surrogates, which would crash the
    worker. They are escaped in the report (the test's own assertions saw the real text)."""
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]


@pytest.fixture(autouse=True)
def _shared_servers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under pytest-xdist (CI runs two test processes): a test marked ``restarts_servers``
    restarts the shared MariaDB or PostgreSQL server, so it runs alone. It takes a file lock
    exclusively, every other test shares it; without xdist, nothing."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    exclusive = request.node.get_closest_marker("restarts_servers") is not None
    path = os.path.join(tempfile.gettempdir(), f"re-tests-servers-{run}.lock")
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
