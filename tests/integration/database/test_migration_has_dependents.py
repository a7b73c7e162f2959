"""Migration 0020 on every database: the tasks that stored dependents already wait for come out
flagged has_dependents, the others not."""

from __future__ import annotations

import pytest
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from django_reliable_executor.models import ReliableTask
from tests.conftest import DB_ALIASES, db_params, require

APP = "django_reliable_executor"
BEFORE = (APP, "0019_batches")
AFTER = (APP, "0020_task_has_dependents")


def migrate(alias: str, target: tuple[str, str]) -> MigrationExecutor:
    executor = MigrationExecutor(connections[alias])
    executor.migrate([target])
    return executor


def latest(alias: str) -> tuple[str, str]:
    """The app's last migration (the test database must end the test as it began)."""
    (leaf,) = MigrationExecutor(connections[alias]).loader.graph.leaf_nodes(APP)
    return leaf


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_migration_0020_flags_the_tasks_dependents_wait_for(alias):
    require(alias)
    executor = migrate(alias, BEFORE)
    try:
        old = executor.loader.project_state([BEFORE]).apps
        task = old.get_model(APP, "ReliableTask")
        edge = old.get_model(APP, "ReliableDependency")
        now = timezone.now()
        for task_id in ("a", "b", "c", "d"):
            task.objects.using(alias).create(
                task_id=task_id, task_name="demo.echo", created_at=now, run_at=now
            )
        edge.objects.using(alias).create(dependency_id="a", dependent_id="c")
        edge.objects.using(alias).create(dependency_id="a", dependent_id="d")
        edge.objects.using(alias).create(dependency_id="c", dependent_id="d")
    finally:
        migrate(alias, AFTER)
        flags = dict(ReliableTask.objects.using(alias).values_list("task_id", "has_dependents"))
        migrate(alias, latest(alias))
    assert flags == {"a": True, "b": False, "c": True, "d": False}
