"""A bulk action's walk (service/bulk_actions.py) run by real workers on every storage: its
worker SIGKILLed mid-walk, another worker finishes it from its last stored chunk, each task
retried once; stopped mid-walk as the progress page's Stop does (a cancel of its task), it
ends CANCELLED between two chunks, its stored progress counting exactly the tasks it acted on.

The targets sit on a queue no worker serves ("in"), so what the walk did to them stays as it
left it. The walk goes a small chunk at a time (CHUNK), so that it is caught half way."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any

import pytest
from django.db import transaction

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.states import DEAD_LETTER_STATUSES
from django_reliable_executor.service import bulk_actions
from django_reliable_executor.service.bulk_walk import BulkAction
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import FAST, LEASE, Backend, service_for, wait_until

TASKS = 1000
CHUNK = 20  # tasks per chunk (a plan and an act, two durable steps): 50 chunks, so that a
# kill or a stop lands half way
OPS = "ops"  # the bulk actions' queue: the only one the workers serve
FAILING = "demo.always_fails"
# A walk whose worker was lost is retried after this (the app's own, RETRY_INTERVAL_MS, is
# 5 s: longer than this test should take).
RETRY_MS = 100


def submitted(service: Any, prefix: str) -> list[str]:
    """TASKS waiting tasks of queue "in" (no worker serves it), oldest first."""
    ids = [f"{prefix}{i:05d}" for i in range(TASKS)]
    service.submit_many(
        [
            TaskSubmitRequest(FAILING, {"i": i}, task_id=t, queue="in", retry_limit=0)
            for i, t in enumerate(ids)
        ]
    )
    return ids


def failed(backend: Backend, service: Any, prefix: str) -> list[str]:
    """TASKS dead letters, each of one attempt: claimed, started and failed (retry_limit 0:
    FAILED); in one transaction on a database (a commit per task took seconds, and so did
    recover_expired of lapsed leases)."""
    ids = submitted(service, prefix)
    storage = service.storage
    atomic = (
        contextlib.nullcontext()
        if backend.name == "redis"
        else transaction.atomic(using=backend.db_alias)
    )
    with atomic:
        while claims := storage.claim("setup", ["in"], 200, 60):
            for claim in storage.start_many(claims, 60):
                assert claim is not None
                storage.fail(claim, "ValueError: boom", retryable=False)
    return ids


def start(service: Any, action: str, filters: dict[str, Any]) -> str:
    """The bulk action's task over ``filters``, as start_bulk_action submits it (the walk
    CHUNK at a time), retried RETRY_MS after a lost worker."""
    until = service.clock.now()
    total = bulk_actions.count_matching(service, filters, None, until)
    assert total == TASKS
    checked = bulk_actions.checked_filters(service, filters)
    bulk = BulkAction(action, checked, None, until, total, CHUNK)
    request = bulk_actions.executor_request(
        bulk, task_id=f"bulk-{action}", unique_key=f"bulk-{action}", queue=OPS
    )
    ((task, created),) = service.submit_many_created(
        [dataclasses.replace(request, retry_interval=RETRY_MS, retry_backoff="fixed")]
    )
    assert created
    return task.task_id


def progress(service: Any, task_id: str) -> int:
    task = service.get_task(task_id)
    return int(task.progress["current"]) if task.progress else 0


def by_status(service: Any, ids: list[str]) -> dict[TaskStatus, int]:
    counts: dict[TaskStatus, int] = {}
    for task in service.storage.get_many(ids).values():
        counts[task.status] = counts.get(task.status, 0) + 1
    return counts


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_walk_whose_worker_is_killed_is_finished_by_another_each_task_retried_once(
    alias, key_prefix, workers, faults
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    # Two workers serve the bulk actions' queue, started while the tasks are prepared.
    both = [workers.start(backend, "--queues", OPS, wait_ready=False, **FAST) for _ in range(2)]
    ids = failed(backend, service, "dead-")
    dead = {"statuses": sorted(s.value for s in DEAD_LETTER_STATUSES), "task_name": FAILING}
    task_id = start(service, "retry", dead)

    # The one that runs the walk is killed once it has stored a few chunks and the plan of
    # the next (an odd number of steps), most likely while it acts on that plan.
    wait_until(
        lambda: len(service.get_task(task_id).steps) >= 5,
        30,
        "the walk stored no chunk",
        interval=0.01,
        logs=workers.logs,
    )
    victim = workers.by_id(service.get_task(task_id).worker_id)
    assert victim is not None
    faults.kill(victim)
    stored = len(service.get_task(task_id).steps)
    assert stored // 2 * CHUNK < TASKS, "the walk ended before the kill"
    (second,) = [process for process in both if process is not victim]
    done = wait_until(
        lambda: (t := service.get_task(task_id)).status.is_terminal and t,
        LEASE * 3 + 60,
        "the walk was not finished by the second worker",
        logs=workers.logs,
    )
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert done.attempts == 2 and done.worker_id == second.worker_id
    # Resumed from its stored chunks (returned as stored, not walked again), then on to the end.
    assert len(done.steps) > stored
    names = [f"{kind}-{n}" for n in range(1, stored // 2 + 2) for kind in ("plan", "chunk")]
    assert [s.name for s in done.steps[:stored]] == names[:stored]
    # Every task retried, once: none left a dead letter, none run again (attempts as they
    # were); the chunk the kill cut short was walked again, its retried tasks skipped then.
    tasks = service.storage.get_many(ids)
    assert by_status(service, ids) == {TaskStatus.PENDING: TASKS}
    assert {task.attempts for task in tasks.values()} == {1}
    result = done.result
    assert result["examined"] == TASKS, result
    assert result["changed"] + result["skipped"].get("PENDING cannot be retried", 0) == TASKS
    assert TASKS - result["changed"] <= CHUNK, result  # only the chunk the kill cut short
    second.terminate()
    assert second.wait(20) == 0, second.log()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_walk_stopped_half_way_ends_cancelled_counting_what_it_did(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    worker = workers.start(backend, "--queues", OPS, wait_ready=False, **FAST)
    ids = submitted(service, "wait-")
    task_id = start(service, "cancel", {"task_name": FAILING, "queue": "in"})

    wait_until(
        lambda: progress(service, task_id) >= 3 * CHUNK,
        30,
        "the walk made no progress",
        interval=0.01,
        logs=workers.logs,
    )
    pressed = time.monotonic()
    assert service.cancel_task(task_id)  # the progress page's Stop (BulkViews._stop_bulk)
    done = wait_until(
        lambda: (t := service.get_task(task_id)).status.is_terminal and t,
        30,
        "the walk did not stop",
        logs=workers.logs,
    )
    assert done.status is TaskStatus.CANCELLED, done.last_error
    assert "stopped by request" in (done.last_error or ""), done.last_error
    # Stopped half way, between two chunks: it acted on whole chunks only, and its progress
    # (what the bulk page shows) counts exactly the tasks it cancelled.
    cancelled = by_status(service, ids).get(TaskStatus.CANCELLED, 0)
    assert 0 < cancelled < TASKS, (cancelled, time.monotonic() - pressed)
    assert cancelled % CHUNK == 0, cancelled
    waiting = TASKS - cancelled  # CREATED or PENDING, as submitted
    assert by_status(service, ids) == {TaskStatus.CANCELLED: cancelled, TaskStatus.CREATED: waiting}
    assert progress(service, task_id) == cancelled
    status = bulk_actions.bulk_status(service, task_id)
    assert status is not None and status.examined == cancelled
    assert status.message == f"{cancelled:,} cancelled"
    # It stays stopped: nothing more is cancelled once it has ended.
    time.sleep(LEASE)
    assert by_status(service, ids).get(TaskStatus.CANCELLED, 0) == cancelled
    worker.terminate()
    assert worker.wait(20) == 0, worker.log()
