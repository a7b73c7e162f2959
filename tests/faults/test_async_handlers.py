"""Faults that hit ``async def`` handlers differently from threads, on all four storages.

- A worker SIGSTOPped with handlers awaiting on its event loop: its leases lapse, another worker
  runs the tasks again; once resumed, its coroutines wake up long past their time and their
  late outcomes (returned or cancelled) are refused by fencing, and it carries on by itself.
- A handler that blocks the event loop (``time.sleep`` in an ``async def``): the heartbeat runs
  on a thread of its own, so no lease lapses, not even the blocking handler's; the master still
  times out a task whose deadline passes meanwhile (the storage says TIMEOUT on time), but the
  loop cancels its coroutine, and any other one whose cancel was requested, only once it is
  free again; pool threads run on. Timeouts and cancels while the loop is free cancel the
  coroutine at once: ``CancelledError`` at its ``await``, its finally-block runs, the task ends
  TIMEOUT or CANCELLED.

Worker kills, killed database connections, a Redis restart, cancel/retry races and poison
results meet async handlers in the drains of the other files of this suite (their tasks mix
sync and async handlers); test_connections.py also kills the connection async handlers' ORM
calls use (``sync_to_async``).
"""

from __future__ import annotations

import re
import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.master.lock import MASTER_LOCK_NAME
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import Journal, check_runs, freeze_mid_run
from tests.support.processes import FAST, LEASE, MASTER_TTL, Backend, service_for, wait_until

ASYNC = "demo.async_journal"
# Few threads, a few async slots: both workers hold async handlers whoever polls first.
POOL = ("--core-pool-size", "1", "--max-pool-size", "1", "--queue-capacity", "0")
FIRST = 24  # tasks of the drain the worker is frozen in
LATER = 12  # tasks submitted after it resumed
SLEEP = 1.0  # seconds each handler awaits: the worker is frozen with handlers half done


def job(task_id: str, sleep: float = SLEEP) -> TaskSubmitRequest:
    return TaskSubmitRequest(ASYNC, {"sleep": sleep}, task_id=task_id, retry_limit=20)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_frozen_worker_s_async_handlers_run_elsewhere_and_their_late_outcomes_are_refused(
    alias, key_prefix, workers, journal, faults
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    storage = service.storage
    both = [
        workers.start(
            backend, *POOL, "--async-concurrency", "6", env=journal.env(), wait_ready=False, **FAST
        )
        for _ in range(2)
    ]
    for process in both:
        process.wait_ready()
    master_id = wait_until(
        lambda: storage.lock_owner(MASTER_LOCK_NAME), 30, "no master", logs=workers.logs
    )
    # The other one is frozen: its tasks are recovered within a lease, not a lock TTL more.
    victim, other = sorted(both, key=lambda p: p.worker_id == master_id)
    first = [f"first-{i:03d}" for i in range(FIRST)]
    service.submit_many([job(i) for i in first])

    stranded = freeze_mid_run(faults, journal, victim, workers.logs)
    frozen_at = time.time()

    def rerun_by_other() -> bool:
        runs = journal.runs()
        return all(
            any(run.pid == other.pid and run.end is not None for run in runs[task_id])
            for task_id in stranded
        )

    wait_until(
        rerun_by_other, LEASE * 3 + 60, "the frozen tasks were not run again", logs=workers.logs
    )
    assert time.time() - frozen_at > LEASE
    faults.thaw(victim)
    thawed_at = time.time()

    # Resumed, its coroutines come back long past their sleep (or are cancelled by the
    # heartbeat, which finds the leases lost first): either way a late outcome, refused.
    for task_id, attempt in stranded.items():
        pattern = rf"task {re.escape(task_id)} \({re.escape(ASYNC)}\): outcome of attempt "
        pattern += rf"{attempt} discarded"
        wait_until(
            lambda pattern=pattern: re.search(pattern, victim.log()),
            30,
            f"the resumed worker's outcome of {task_id} was not discarded",
            logs=workers.logs,
        )
        [late] = [r for r in journal.runs()[task_id] if r.pid == victim.pid]
        # It had not ended when frozen: it ended (returned or was cancelled) once resumed.
        assert late.end is not None and late.end > frozen_at, late

    later = [f"later-{i:03d}" for i in range(LATER)]
    service.submit_many([job(i, 0.2) for i in later])
    wait_until(
        lambda: service.count_by_status()[TaskStatus.COMPLETED] == FIRST + LATER,
        LEASE * 3 + 60,
        "the drain did not finish",
        logs=workers.logs,
    )
    # Every task keeps the outcome of its newest attempt (demo.async_journal returns it).
    runs = journal.runs()
    for task_id in first + later:
        task = service.get_task(task_id)
        assert task is not None
        newest = max(run.attempt for run in runs[task_id])
        assert (task.result, task.attempts) == (newest, newest), (task_id, runs[task_id])
    for task_id, attempt in stranded.items():
        assert service.get_task(task_id).result != attempt
    problems = check_runs(journal, faults, service, first + later)
    assert not problems, "\n".join(problems[:20])
    # Its loop carried on by itself: handlers started there after the thaw.
    assert victim.pid in journal.pids_running_after(thawed_at), victim.log()
    for process in both:
        process.terminate()
    for process in both:
        assert process.wait(30) == 0, process.log()


# A blocked loop: a lease shorter than the block, so one missed renewal would show.
BLOCK_LEASE = 1.5  # seconds
BLOCK = 3.5  # seconds the "hog" blocks the loop, after awaiting HOG_AWAIT
HOG_AWAIT = 2.0
# Seconds from creation. The early deadline comes before the block whatever the start latency
# (the hog's own timer ends its await later); the late one within it, for start latencies
# below 1.6 s, and long enough before its end for a chores round (MASTER_TTL / 4) to pass.
EARLY_DEADLINE = 1.5
LATE_DEADLINE = HOG_AWAIT + 1.6
PROMPT = 1.0  # seconds: a cancel or timeout the loop is free to act on is acted on within this


def _one(journal: Journal, task: str, event: str) -> dict:
    records = journal.events(task, event)
    assert len(records) == 1, (task, event, journal.records())
    return records[0]


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_blocked_event_loop_keeps_every_lease_and_delays_only_its_cancellations(
    alias, key_prefix, workers, journal, faults
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    worker = workers.start(
        backend,
        "--core-pool-size",
        "2",
        "--max-pool-size",
        "2",
        env=journal.env(),
        lease_timeout=BLOCK_LEASE,
        master_lock_ttl=MASTER_TTL,
    )
    wait_until(
        lambda: service.storage.lock_owner(MASTER_LOCK_NAME) == worker.worker_id,
        30,
        "the worker did not become master",
        logs=workers.logs,
    )
    # Deadlines count from creation: early-timeout's falls while the loop is free, well before
    # the hog blocks it (HOG_AWAIT after its start); late-timeout's during the block.
    service.submit_many(
        [
            TaskSubmitRequest(ASYNC, {"sleep": HOG_AWAIT, "block": BLOCK}, task_id="hog"),
            TaskSubmitRequest(
                ASYNC,
                {"sleep": 60},
                task_id="early-timeout",
                retry_limit=0,
                max_duration_millis=int(EARLY_DEADLINE * 1000),
            ),
            TaskSubmitRequest(
                ASYNC,
                {"sleep": 60},
                task_id="late-timeout",
                retry_limit=0,
                max_duration_millis=int(LATE_DEADLINE * 1000),
            ),
            TaskSubmitRequest(ASYNC, {"sleep": 60}, task_id="early-cancel"),
            TaskSubmitRequest(ASYNC, {"sleep": 60}, task_id="late-cancel"),
            # Awaiting past the block's start: they wake up only once the loop is free.
            *(
                TaskSubmitRequest(ASYNC, {"sleep": HOG_AWAIT + 1.0}, task_id=f"steady-{i}")
                for i in range(4)
            ),
        ]
    )
    wait_until(lambda: journal.started() == 9, 30, "the handlers did not start", logs=workers.logs)
    assert service.cancel_task("early-cancel")
    early_cancel_at = time.time()
    hog_started = _one(journal, "hog", "start")["t"]
    blocked_from = hog_started + HOG_AWAIT
    # Once the loop is blocked: a cancel request, and synchronous tasks for the pool threads.
    time.sleep(max(0.0, blocked_from + 0.3 - time.time()))
    assert not journal.events("hog", "end"), "the hog ended before the test acted in its block"
    assert service.cancel_task("late-cancel")
    late_cancel_at = time.time()
    sync = [f"sync-{i}" for i in range(4)]
    service.submit_many(
        [TaskSubmitRequest("demo.journal", {"sleep": 0.2}, task_id=i) for i in sync]
    )
    # The master (its own chores thread) times late-timeout out in the storage during the block.
    wait_until(
        lambda: service.get_task("late-timeout").status is TaskStatus.TIMEOUT,
        BLOCK,
        "late-timeout was not timed out in the storage",
        logs=workers.logs,
    )
    timed_out_seen = time.time()
    every = [
        "hog",
        "early-timeout",
        "late-timeout",
        "early-cancel",
        "late-cancel",
        *(f"steady-{i}" for i in range(4)),
        *sync,
    ]
    wait_until(
        lambda: all(service.get_task(i).status.is_terminal for i in every),
        BLOCK + 30,
        "the tasks did not all end",
        logs=workers.logs,
    )
    hog_end = _one(journal, "hog", "end")["t"]
    assert hog_end - blocked_from >= BLOCK - 0.1, "the loop was not blocked as long as asked"
    assert timed_out_seen < hog_end, "the storage said TIMEOUT only once the loop was free"

    # Leases kept through the block, the hog's own included: every task ran once, on attempt 1.
    problems = check_runs(journal, faults, service, ["hog", *(f"steady-{i}" for i in range(4))])
    problems += check_runs(journal, faults, service, sync)
    problems += check_runs(
        journal, faults, service, ["early-timeout", "late-timeout"], expected=TaskStatus.TIMEOUT
    )
    problems += check_runs(
        journal, faults, service, ["early-cancel", "late-cancel"], expected=TaskStatus.CANCELLED
    )
    assert not problems, "\n".join(problems)
    for task_id in every:
        task = service.get_task(task_id)
        assert task.attempts == 1, task
        assert "worker lost" not in (task.last_error or ""), task
    # The pool threads ran on while the loop was blocked.
    assert all(_one(journal, i, "end")["t"] < hog_end for i in sync)

    # Cancelled coroutines: CancelledError at their await, finally-block run, no end reached.
    for task_id in ("early-timeout", "late-timeout", "early-cancel", "late-cancel"):
        cancelled = _one(journal, task_id, "cancelled")["t"]
        assert _one(journal, task_id, "finally")["t"] >= cancelled
        assert not journal.events(task_id, "end"), task_id
    deadline = service.get_task("early-timeout").created_at.timestamp() + EARLY_DEADLINE
    assert deadline <= _one(journal, "early-timeout", "cancelled")["t"] < deadline + PROMPT
    assert (
        early_cancel_at < _one(journal, "early-cancel", "cancelled")["t"] < early_cancel_at + PROMPT
    )
    # Those the block held up were cancelled as soon as the loop was free, not later.
    for task_id in ("late-timeout", "late-cancel"):
        assert hog_end <= _one(journal, task_id, "cancelled")["t"] < hog_end + PROMPT, task_id
    assert late_cancel_at < hog_end
    for task_id in ("early-timeout", "late-timeout"):
        assert "since creation exceeded" in service.get_task(task_id).last_error, task_id
    for task_id in (f"steady-{i}" for i in range(4)):
        assert hog_end <= _one(journal, task_id, "end")["t"], task_id
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()
