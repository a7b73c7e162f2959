"""Workers SIGKILLed at random during a drain: nothing lost, nothing run twice at once, and a
task runs again only because its worker died."""

from __future__ import annotations

import random
import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest

from ..conftest import BACKENDS, db_params, require
from ..processes import FAST, LEASE, Backend, service_for, wait_until
from .journal import check_runs

TASKS = 600
TAIL = 60  # submitted after the last kill: the living workers must take them by themselves


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_workers_killed_at_random_during_a_drain(alias, key_prefix, workers, journal, faults):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    rng = random.Random(11)
    ids = [f"drain-{i:04d}" for i in range(TASKS)]
    service.submit_many(
        [TaskSubmitRequest("demo.journal", {"sleep": 0.25}, task_id=i, retry_limit=20) for i in ids]
    )
    start = [workers.start(backend, wait_ready=False, env=journal.env(), **FAST) for _ in range(3)]
    for process in start:
        process.wait_ready()
    alive = list(start)

    # Four kills, each of a random living worker once it has run something, each replaced.
    for _ in range(4):
        wait_until(lambda: journal.started() > 0, 30, "no handler started", logs=workers.logs)
        time.sleep(rng.uniform(0.3, 1.2))
        victim = rng.choice(alive)
        assert service.count_by_status()[TaskStatus.COMPLETED] < TASKS, "killed after the drain"
        faults.kill(victim)
        alive.remove(victim)
        replacement = workers.start(backend, wait_ready=False, env=journal.env(), **FAST)
        alive.append(replacement)
    last_kill = max(faults.killed.values())

    tail = [f"tail-{i:03d}" for i in range(TAIL)]
    service.submit_many([TaskSubmitRequest("demo.journal", task_id=i) for i in tail])
    ids += tail

    wait_until(
        lambda: service.count_by_status()[TaskStatus.COMPLETED] == TASKS + TAIL,
        LEASE * 3 + 60,
        "the drain did not finish",
        logs=workers.logs,
    )
    problems = check_runs(journal, faults, service, ids)
    assert not problems, "\n".join(problems[:20])
    # The living workers carried on by themselves: they ran handlers after the last kill.
    assert {p.pid for p in alive} & journal.pids_running_after(last_kill)
    for process in alive:
        process.wait_ready()  # a replacement signalled before its handlers are set dies of it
        process.terminate()
    for process in alive:
        assert process.wait(20) == 0, process.log()
