"""Shared fixtures: one storage per database alias, an injected clock, service reachability.

A service that cannot be reached skips its tests locally and fails them under CI (CI=true).
"""

from __future__ import annotations

import os
import socket

import pytest

from django_reliable_executor.clock import FakeClock
from django_reliable_executor.service import ReliableExecutor
from django_reliable_executor.storage.database import DatabaseStorage

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

SERVERS = {
    "mariadb": (
        os.environ.get("RE_MARIADB_HOST", "127.0.0.1"),
        int(os.environ.get("RE_MARIADB_PORT", "3306")),
    ),
    "postgres": (
        os.environ.get("RE_POSTGRES_HOST", "127.0.0.1"),
        int(os.environ.get("RE_POSTGRES_PORT", "5432")),
    ),
}
DB_ALIASES = ["default", "mariadb", "postgres"]  # default is SQLite
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
    """pytest params for each database alias, marked for a transactional test database."""
    return [
        pytest.param(
            alias,
            id="sqlite" if alias == "default" else alias,
            marks=pytest.mark.django_db(
                transaction=True, databases=[alias], available_apps=TASK_APPS
            ),
        )
        for alias in (aliases or DB_ALIASES)
    ]


@pytest.fixture(params=db_params())
def alias(request: pytest.FixtureRequest) -> str:
    require(request.param)
    return request.param


@pytest.fixture(autouse=True)
def _clear_hooks():
    """Per-task behaviour set by contract tests (tests/contract_support.py) never leaks."""
    from tests.contract_support import HOOKS

    HOOKS.clear()
    yield
    HOOKS.clear()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def storage(alias: str, clock: FakeClock) -> DatabaseStorage:
    return DatabaseStorage(alias=alias, clock=clock, backoff_cap_millis=300000)


@pytest.fixture
def executor(storage: DatabaseStorage, clock: FakeClock) -> ReliableExecutor:
    """A service over the test storage and the fake clock."""
    return ReliableExecutor(storage, clock=clock)


@pytest.fixture
def workers(tmp_path):
    """Starts ``runexecutor`` subprocesses (tests/processes.py); kills every leftover at teardown,
    before the test database is flushed."""
    from tests.processes import Workers

    started = Workers(tmp_path)
    yield started
    started.kill_all()
