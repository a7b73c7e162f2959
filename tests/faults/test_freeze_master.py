"""The master SIGSTOPped for longer than its lock TTL and its leases: another worker becomes
master and recovers its tasks; once resumed, the frozen worker's stale outcomes are refused, it
gives the mastership up, and it carries on running tasks by itself."""

from __future__ import annotations

import re
import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.master.lock import MASTER_LOCK_NAME
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import check_runs, freeze_mid_run
from tests.support.processes import MASTER_TTL, Backend, service_for, wait_until

# Longer than the shared LEASE and the master lock TTL: the frozen master's lock is taken over
# before its tasks' leases lapse.
LEASE = 3.0  # seconds
FAST = {"lease_timeout": LEASE, "master_lock_ttl": MASTER_TTL}
FIRST = 40  # tasks of the drain the master is frozen in
LATER = 20  # tasks submitted after it resumed
SLEEP = 1.0  # seconds each handler works: the master is frozen with handlers half done
# Each worker takes few tasks at a time, so both have some whoever polls first.
POOL = ("--core-pool-size", "4", "--max-pool-size", "4", "--queue-capacity", "1")


def job(task_id: str) -> TaskSubmitRequest:
    return TaskSubmitRequest("demo.journal", {"sleep": SLEEP}, task_id=task_id, retry_limit=20)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_frozen_master_is_replaced_and_its_stale_writes_refused(
    alias, key_prefix, workers, journal, faults
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    storage = service.storage
    master = workers.start(backend, *POOL, env=journal.env(), **FAST)
    wait_until(
        lambda: storage.lock_owner(MASTER_LOCK_NAME) == master.worker_id,
        30,
        "the first worker did not become master",
        logs=workers.logs,
    )
    other = workers.start(backend, *POOL, env=journal.env(), **FAST)
    first = [f"first-{i:03d}" for i in range(FIRST)]
    service.submit_many([job(i) for i in first])

    stranded = freeze_mid_run(faults, journal, master, workers.logs)
    frozen_at = time.time()
    # The other worker takes the lock once it expires, and recovers the frozen leases: every
    # stranded task is run again, to its end, by the other worker while the master is stopped.
    wait_until(
        lambda: storage.lock_owner(MASTER_LOCK_NAME) == other.worker_id,
        MASTER_TTL * 3 + 30,
        "nobody took over the master lock",
        logs=workers.logs,
    )

    def rerun_by_other() -> bool:
        runs = journal.runs()
        return all(
            any(run.pid == other.pid and run.end is not None for run in runs[task_id])
            for task_id in stranded
        )

    wait_until(
        rerun_by_other, LEASE * 3 + 60, "the frozen tasks were not run again", logs=workers.logs
    )
    assert time.time() - frozen_at > max(LEASE, MASTER_TTL)
    faults.thaw(master)
    thawed_at = time.time()

    # Resumed, it hears it lost the lock within a TTL and stays a plain worker: one master.
    wait_until(
        lambda: f"worker {master.worker_id} lost the master lock" in master.log(),
        MASTER_TTL * 3 + 30,
        "the resumed master did not give the lock up",
        logs=workers.logs,
    )
    until = time.monotonic() + MASTER_TTL * 2
    while time.monotonic() < until:
        assert storage.lock_owner(MASTER_LOCK_NAME) == other.worker_id
        time.sleep(0.1)
    assert master.log().count(f"worker {master.worker_id} took the master lock") == 1

    later = [f"later-{i:03d}" for i in range(LATER)]
    service.submit_many([job(i) for i in later])
    wait_until(
        lambda: service.count_by_status()[TaskStatus.COMPLETED] == FIRST + LATER,
        LEASE * 3 + 90,
        "the drain did not finish",
        logs=workers.logs,
    )

    # Its stale outcomes were refused: each logged as discarded, the storage keeps the result
    # of the run that replaced it (demo.journal returns its attempt number).
    for task_id, attempt in stranded.items():
        pattern = (
            rf"task {re.escape(task_id)} \(demo\.journal\): outcome of attempt {attempt} discarded"
        )
        wait_until(
            lambda pattern=pattern: re.search(pattern, master.log()),
            30,
            f"the resumed master's outcome of {task_id} was not discarded",
            logs=workers.logs,
        )
        task = service.get_task(task_id)
        assert task is not None and task.status is TaskStatus.COMPLETED
        replacing = [r for r in journal.runs()[task_id] if r.pid == other.pid and r.end]
        assert task.result == replacing[-1].attempt != attempt

    # Every task, stranded or not (a claim started just before the freeze runs its handler
    # only after the thaw), keeps the outcome of its newest attempt: no stale write landed.
    runs = journal.runs()
    for task_id in first + later:
        task = service.get_task(task_id)
        assert task is not None
        newest = max(run.attempt for run in runs[task_id])
        assert (task.result, task.attempts) == (newest, newest), (task_id, runs[task_id])

    problems = check_runs(journal, faults, service, first + later)
    assert not problems, "\n".join(problems[:20])
    # It carried on by itself: handlers started after the thaw.
    assert master.pid in journal.pids_running_after(thawed_at)
    for process in (master, other):
        process.terminate()
    for process in (master, other):
        assert process.wait(30) == 0, process.log()
