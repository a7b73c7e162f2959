"""Workers SIGKILLed at random during a drain: nothing lost, nothing run twice at once, and a
task runs again only because its worker died. The drain mixes sync handlers (pool threads) and
async ones (the event loop), and the kills hit workers with async handlers awaiting."""

from __future__ import annotations

import random
import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import check_runs, unfinished_runs
from tests.support.processes import FAST, LEASE, Backend, service_for, wait_until

TASKS = 600
EVERY = 5  # every fifth task of the drain is async: ASYNC_TASKS of TASKS
ASYNC_TASKS = TASKS // EVERY
TAIL = 60  # submitted after the last kill: the living workers must take them by themselves


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_workers_killed_at_random_during_a_drain(alias, key_prefix, workers, journal, faults):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    rng = random.Random(11)
    ids = [f"drain-{i:04d}" for i in range(TASKS)]
    # The async ones await longer, on few slots: the first kills find some under way.
    async_ids = set(ids[::EVERY])
    service.submit_many(
        [
            TaskSubmitRequest("demo.async_journal", {"sleep": 0.5}, task_id=i, retry_limit=20)
            if i in async_ids
            else TaskSubmitRequest("demo.journal", {"sleep": 0.25}, task_id=i, retry_limit=20)
            for i in ids
        ]
    )
    options = ("--async-concurrency", "8")
    start = [
        workers.start(backend, *options, wait_ready=False, env=journal.env(), **FAST)
        for _ in range(3)
    ]
    for process in start:
        process.wait_ready()
    alive = list(start)

    # Four kills, each of a random living worker once it has run something, each replaced;
    # a worker with async handlers under way when there is one.
    async_hit = 0
    for _ in range(4):
        wait_until(lambda: journal.started() > 0, 30, "no handler started", logs=workers.logs)
        time.sleep(rng.uniform(0.3, 1.2))
        awaiting = {p.pid: len(async_ids & set(unfinished_runs(journal, p.pid))) for p in alive}
        victim = rng.choice([p for p in alive if awaiting[p.pid]] or alive)
        assert service.count_by_status()[TaskStatus.COMPLETED] < TASKS, "killed after the drain"
        faults.kill(victim)
        async_hit += awaiting[victim.pid]
        alive.remove(victim)
        replacement = workers.start(backend, *options, wait_ready=False, env=journal.env(), **FAST)
        alive.append(replacement)
    assert async_hit, "no kill hit a worker with async handlers under way"
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
