"""A worker warns when nothing vacuums the task table on PostgreSQL (autovacuum off)."""

from __future__ import annotations

import pytest
from django.db import connections

from django_reliable_executor.service import ReliableExecutor
from django_reliable_executor.storage.database import DatabaseStorage
from tests.conftest import require, start_warnings

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
