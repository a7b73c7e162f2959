"""A worker warns when nothing vacuums the task table on PostgreSQL (autovacuum off), or when
MariaDB's task table has columns not in utf8mb4."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections

from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.database import DatabaseStorage
from tests.conftest import require, start_warnings
from tests.support.contract_support import HOOKS, run_next

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "mariadb", "postgres"])
TABLE = "reliable_executor_task"


@pytest.fixture
def postgres() -> DatabaseStorage:
    require("postgres")
    return DatabaseStorage(alias="postgres")


def server_setting(name: str) -> str:
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return cursor.fetchone()[0]


def test_the_server_s_autovacuum_setting_is_read(postgres):
    # This machine's server may run either way: the warning must follow what it answers.
    warned = any("autovacuum = off" in w for w in postgres.server_warnings())
    assert warned == (server_setting("autovacuum") == "off")


def test_track_counts_off_is_named(postgres):
    with connections["postgres"].cursor() as cursor:
        cursor.execute("SET track_counts = off")  # a superuser may, per session
    try:
        assert any("track_counts = off" in w and TABLE in w for w in postgres.server_warnings())
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute("RESET track_counts")


def test_autovacuum_disabled_on_the_table_is_named(postgres):
    assert not any("autovacuum_enabled" in w for w in postgres.server_warnings())
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = off)")
    try:
        [warning] = [w for w in postgres.server_warnings() if "autovacuum_enabled" in w]
        assert f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)" in warning
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")


@pytest.mark.parametrize("alias", ["default", "mariadb"])
def test_other_databases_have_nothing_to_say(alias):
    """(MariaDB's test database is utf8mb4 throughout.)"""
    require(alias)
    assert DatabaseStorage(alias=alias).server_warnings() == []


def test_the_worker_logs_it_when_it_starts(postgres, caplog):
    with connections["postgres"].cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE} SET (autovacuum_enabled = false)")
    try:
        warnings = start_warnings(ReliableExecutor(postgres), caplog)
    finally:
        with connections["postgres"].cursor() as cursor:
            cursor.execute(f"ALTER TABLE {TABLE} RESET (autovacuum_enabled)")
    assert any("autovacuum_enabled = off" in w for w in warnings), warnings


@pytest.fixture
def narrow_last_error() -> Iterator[DatabaseStorage]:
    """MariaDB's task table with last_error in utf8mb3, as a database created as utf8 has it
    (restored afterwards)."""
    require("mariadb")
    with connections["mariadb"].cursor() as cursor:
        cursor.execute(
            "SELECT COLLATION_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
            "DATABASE() AND TABLE_NAME = %s AND COLUMN_NAME = 'last_error'",
            [TABLE],
        )
        [collation] = cursor.fetchone()
        cursor.execute(f"ALTER TABLE {TABLE} MODIFY last_error longtext CHARACTER SET utf8mb3 NULL")
    try:
        yield DatabaseStorage(alias="mariadb")
    finally:
        with connections["mariadb"].cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE {TABLE} MODIFY last_error longtext CHARACTER SET utf8mb4 "
                f"COLLATE {collation} NULL"
            )


def test_a_mariadb_column_not_in_utf8mb4_is_named(narrow_last_error, caplog):
    [warning] = narrow_last_error.server_warnings()
    assert "last_error (longtext, utf8mb3)" in warning
    assert "4-byte character" in warning
    warnings = start_warnings(ReliableExecutor(narrow_last_error), caplog)
    assert any("last_error (longtext, utf8mb3)" in w for w in warnings), warnings


def test_an_error_such_a_column_refuses_is_recorded_escaped(narrow_last_error):
    """The worker's last resort: the failure is recorded with its text in ASCII, not lost
    (lost, the task would run again once its lease lapsed)."""
    service = ReliableExecutor(narrow_last_error)
    service.submit("contract.hook", None, task_id="emoji", retry_limit=0)

    def fail(context):
        raise ValueError("bad news \U0001f600")

    HOOKS["emoji"] = fail
    assert run_next(service) is TaskStatus.FAILED
    info = service.get_task("emoji")
    assert "ValueError: bad news \\U0001f600\n(text altered: non-ASCII characters escaped" in (
        info.last_error
    )
