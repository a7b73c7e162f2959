"""Migration 0033 on every database: each (name, key) row of reliable_executor_fair_key becomes
that key's row in every queue and priority of the name's unfinished tasks, with its next round;
on MariaDB the key column stays NO PAD binary (0032)."""

from __future__ import annotations

import pytest
from django.db import connections
from django.utils import timezone

from django_reliable_executor.models import ReliableFairKey
from tests.conftest import DB_ALIASES, db_params, require
from tests.integration.database.test_migration_has_dependents import APP, latest, migrate

BEFORE = (APP, "0032_fair_rounds")
AFTER = (APP, "0033_fair_rounds_per_queue")


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_migration_0033_gives_each_key_its_rounds_per_queue_and_priority(alias):
    require(alias)
    executor = migrate(alias, BEFORE)
    try:
        old = executor.loader.project_state([BEFORE]).apps
        task = old.get_model(APP, "ReliableTask").objects.using(alias)
        key = old.get_model(APP, "ReliableFairKey").objects.using(alias)
        now = timezone.now()
        for task_id, queue, priority, status in [
            ("t1", "default", 0, "CREATED"),
            ("t2", "mail", 5, "RUNNING"),
            ("t3", "mail", 5, "PENDING"),
            ("t4", "old", 1, "COMPLETED"),  # finished: its queue and priority get no row
        ]:
            task.create(
                task_id=task_id,
                task_name="demo.fair",
                queue=queue,
                priority=priority,
                status=status,
                created_at=now,
                run_at=now,
            )
        key.create(name="demo.fair", key="A", next_round=7)
        key.create(name="demo.fair", key="", next_round=3)
    finally:
        migrate(alias, AFTER)
        rows = sorted(
            ReliableFairKey.objects.using(alias).values_list(
                "name", "queue", "priority", "key", "next_round"
            )
        )
        ReliableFairKey.objects.using(alias).all().delete()  # the reversal's old constraint
        migrate(alias, latest(alias))
    assert rows == [
        ("demo.fair", "default", 0, "", 3),
        ("demo.fair", "default", 0, "A", 7),
        ("demo.fair", "mail", 5, "", 3),
        ("demo.fair", "mail", 5, "A", 7),
    ]


@pytest.mark.parametrize("alias", db_params(["mariadb"]))
def test_the_fair_key_columns_are_binary_on_mariadb(alias):
    require(alias)
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name = 'reliable_executor_fair_key' "
            "AND column_name IN ('name', 'key', 'queue')"
        )
        collations = dict(cursor.fetchall())
    # the queue as the tasks' queue column (byte for byte: "Mail" and "mail" are two queues)
    assert collations == {
        "name": "utf8mb4_nopad_bin",
        "key": "utf8mb4_nopad_bin",
        "queue": "utf8mb4_bin",
    }
    rows = ReliableFairKey.objects.using(alias)
    rows.create(name="n", queue="default", priority=0, key="A", next_round=1)
    rows.create(name="n", queue="default", priority=0, key="A ", next_round=1)
    assert rows.count() == 2
