"""A start write that fails even on a new connection: the worker hands the claim back at once,
so the task runs as soon as the storage takes the start again, not a lease later."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import DB_ALIASES, db_params, require
from tests.support.journal import check_runs
from tests.support.processes import Backend, service_for, wait_until
from tests.support.refusals import refused

LEASE = 30.0  # a task left to its lease would wait this long: far beyond what is waited here
WINDOW = 2.0
# The start's UPDATE of the one task the test picks: waiting -> RUNNING.
START_OF_VICTIM = "OLD.task_id = 'victim' AND NEW.status = 'RUNNING' AND OLD.status <> 'RUNNING'"


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_refused_start_hands_the_claim_back_at_once(alias, key_prefix, workers, journal, faults):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    worker = workers.start(backend, env=journal.env(), lease_timeout=LEASE)
    with refused(alias, "reliable_executor_task", condition=START_OF_VICTIM):
        service.submit_many(
            [
                TaskSubmitRequest("demo.journal", task_id="victim"),
                *(TaskSubmitRequest("demo.journal", task_id=f"other-{i}") for i in range(20)),
            ]
        )
        time.sleep(WINDOW)
        assert service.get_task("victim").status is not TaskStatus.RUNNING
    allowed_until = time.monotonic() + 10
    wait_until(
        lambda: service.get_task("victim").status is TaskStatus.COMPLETED,
        LEASE / 2,
        "the task whose start was refused did not run once starts went through",
        logs=workers.logs,
    )
    assert time.monotonic() < allowed_until, "the claim waited for its lease instead"
    victim = service.get_task("victim")
    assert victim.attempts == 1  # the refused starts counted no attempt
    ids = ["victim", *(f"other-{i}" for i in range(20))]
    wait_until(
        lambda: all(service.get_task(i).status is TaskStatus.COMPLETED for i in ids),
        20,
        "the other tasks did not complete",
        logs=workers.logs,
    )
    problems = check_runs(journal, faults, service, ids)
    assert not problems, "\n".join(problems)
    worker.terminate()
    assert worker.wait(20) == 0, worker.log()
