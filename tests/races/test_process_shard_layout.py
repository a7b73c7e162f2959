"""The Redis shard layout recorded under the key prefix, with real runexecutor workers: a worker
with another REDIS_SHARDS than the submitters refuses to start (naming both layouts) instead of
never seeing their tasks, the system check says the same (E010), and ``executor shards N
--apply`` switches the recorded layout with the paused queues carried over. What ran is read
from the handler's own records (one Execution row per run of demo.record)."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import override_settings

from django_reliable_executor.checks import check_database
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.service.reliable_executor import executor as module_executor
from django_reliable_executor.storage.redis.layout import describe_layout
from tests.conftest import db_params, require
from tests.support.processes import Backend, executions, service_for, wait_until


def ran(backend: Backend, task_id: str) -> bool:
    return executions(backend, task_id).filter(finished=True).exists()


def other_layout(backend: Backend) -> int:
    return 3 if backend.shards == 1 else 1


def settings_of(backend: Backend, shards: int) -> dict[str, object]:
    return {
        "STORAGE": "redis",
        "REDIS_URL": backend.redis_url,
        "KEY_PREFIX": backend.key_prefix,
        "REDIS_SHARDS": shards,
    }


def test_a_worker_with_other_redis_shards_than_the_submitters_never_misses_their_tasks(
    alias, key_prefix, workers
):
    """On Redis it refuses to start, naming both layouts and the way to switch; on the
    databases REDIS_SHARDS applies to nothing and the worker runs the task."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit("demo.record", None, task_id="t1")
    other = other_layout(backend)
    skewed = dataclasses.replace(backend, shards=other)
    worker = workers.start(skewed, "--burst", env={"RE_REDIS_SHARDS": str(other)}, wait_ready=False)
    code = worker.wait(60)
    if alias != "redis":
        assert code == 0, worker.log()
        assert executions(backend, "t1").filter(finished=True).count() == 1
        return
    log = worker.log()
    assert code != 0, log
    assert f"{describe_layout(other)} here" in log, log
    assert f"stored in the layout {describe_layout(backend.shards)}" in log, log
    assert f"executor shards {other} --apply" in log, log
    assert not executions(backend, "t1").exists()
    # The submitter's side of the same check: a submit with the other layout is refused
    # (nothing stored), and so is the system check of a process configured with it.
    wrong = service_for(skewed)
    with pytest.raises(ImproperlyConfigured, match=re.escape(describe_layout(other))):
        wrong.submit("demo.record", None, task_id="t2")
    assert service.get_task("t2") is None and wrong.get_task("t2") is None
    wrong.storage.close()
    with override_settings(RELIABLE_EXECUTOR=settings_of(backend, other)):
        errors = [e for e in check_database(databases=["default"]) if e.level >= 40]
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E010", "REDIS_SHARDS")]
    assert describe_layout(other) in errors[0].msg
    assert describe_layout(backend.shards) in errors[0].msg
    # A worker with the submitters' layout runs it.
    worker = workers.start(backend, "--burst", wait_ready=False)
    assert worker.wait(60) == 0, worker.log()
    assert ran(backend, "t1")
    service.storage.close()


def shards_command(backend: Backend, shards: int, target: int, *args: str) -> tuple[int, str]:
    """``manage.py executor shards <target> [args]`` in a process configured with ``shards``."""
    out = io.StringIO()
    with override_settings(RELIABLE_EXECUTOR=settings_of(backend, shards)):
        try:
            call_command("executor", "shards", str(target), *args, stdout=out)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        module_executor.storage.close()
    return code, out.getvalue()


@pytest.mark.parametrize("alias", db_params(["redis"]), indirect=True)
def test_the_reshard_procedure_switches_the_recorded_layout_and_keeps_queues_paused(
    alias, key_prefix, workers
):
    """Drained and stopped, ``executor shards N`` checks and ``--apply`` switches: from then
    on a worker with the old REDIS_SHARDS is refused and one with N starts; a queue paused
    before the switch stays paused in the new layout until resumed."""
    backend = Backend(alias, key_prefix)
    target = other_layout(backend)
    service = service_for(backend)
    service.submit("demo.record", None, task_id="before", queue="mail")
    first = workers.start(backend, "--queues", "mail,default", "--burst")
    assert first.wait(60) == 0, first.log()
    assert ran(backend, "before")
    assert service.pause_queue("mail") is True

    code, out = shards_command(backend, backend.shards, target)
    assert code == 0, out
    assert "paused queues: mail (carried over)" in out
    assert out.splitlines()[-1].startswith("ready: run again with --apply")
    code, out = shards_command(backend, backend.shards, target, "--apply")
    assert code == 0, out
    assert f"the layout of key prefix {key_prefix!r} is REDIS_SHARDS = {target} now" in out
    # Applied once: the old setting is refused by the check too (it names the recorded one).
    code, out = shards_command(backend, backend.shards, target)
    assert (
        code == 1
        and f"the layout recorded under the key prefix is {describe_layout(target)}" in out
    )

    old = workers.start(backend, "--queues", "mail,default", wait_ready=False)
    assert old.wait(60) != 0, old.log()
    assert f"stored in the layout {describe_layout(target)}" in old.log()

    new = dataclasses.replace(backend, shards=target)
    env = {"RE_REDIS_SHARDS": str(target)}
    moved: ReliableExecutor = service_for(new)
    assert moved.paused_queues() == {"mail"}
    moved.submit("demo.record", None, task_id="after", queue="mail")
    worker = workers.start(new, "--queues", "mail,default", env=env)
    # The banner (what start waits for) is printed before the worker reads the paused queues.
    wait_until(
        lambda: "paused queues, claimed from once resumed: mail" in worker.log(),
        30,
        "the worker did not warn of the paused queue",
        logs=workers.logs,
    )
    # Submitted after "after" with the same priority: claimed first only if mail is paused.
    moved.submit("demo.record", None, task_id="other", queue="default")
    wait_until(
        lambda: ran(new, "other"), 60, "the new layout's worker ran nothing", logs=workers.logs
    )
    assert not executions(new, "after").exists()
    assert moved.resume_queue("mail") is True
    wait_until(lambda: ran(new, "after"), 60, "'after' did not run once resumed", logs=workers.logs)
    assert executions(new, "after").count() == 1
    moved.storage.close()
    service.storage.close()
