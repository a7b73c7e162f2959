"""Cancel and retry racing real workers: a claim taken before a cancel and a retry never starts
the task, and a task that timed out while its handler still runs is not retried until the
handler has ended. Checked against the handlers' own records on all four storages. A third of
the racing tasks have async handlers, started by the event loop's feeder thread; a cancel of a
running one cancels its coroutine: shown by one held async task, cancelled once its handler has
said it started, whatever the random cancels happened to hit."""

from __future__ import annotations

import random
import threading
import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import Run, check_runs
from tests.support.processes import FAST, LEASE, Backend, service_for, wait_until

TASKS = 120
ASYNC = "demo.async_journal"
CHAOS_SECONDS = 8.0
# An async task whose first attempt awaits far longer than any heartbeat takes to pass on a
# cancel, even on a loaded machine: cancelled once its handler has started, it must say
# "cancelled" (its coroutine stopped), never "end". The random cancels alone cannot promise
# that: the other handlers await 0.3 s, less than the heartbeat's interval (LEASE / 4).
HELD = "race-held"
HELD_SLEEP = 120.0
# A small pool and a deep local queue: claims wait here unstarted long enough for a cancel and
# a retry to slip in between the claim and the start.
POOL = (
    *("--core-pool-size", "2", "--max-pool-size", "2", "--queue-capacity", "20"),
    *("--async-concurrency", "2"),
)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_cancels_and_retries_at_random_during_a_drain(alias, key_prefix, workers, journal, faults):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    rng = random.Random(5)
    ids = [f"race-{i:03d}" for i in range(TASKS)]
    _submit(service, ids)
    started = [
        workers.start(backend, *POOL, wait_ready=False, env=journal.env(), **FAST) for _ in range(3)
    ]
    for process in started:
        process.wait_ready()

    acted = {"cancelled": 0, "retried": 0}
    errors: list[BaseException] = []
    stop = threading.Event()

    def chaos() -> None:
        try:
            _cancel_and_retry_at_random(service, rng, acted, stop)
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    thread = threading.Thread(target=chaos, name="cancel-retry-chaos")
    thread.start()
    held_pid = _cancel_the_held_task_once_running(service, journal, workers.logs)
    thread.join(CHAOS_SECONDS + 60)
    stop.set()
    assert not errors, errors
    assert acted["cancelled"] and acted["retried"], acted

    # Re-drive what stayed cancelled until every task has completed.
    def all_completed() -> bool:
        for task in service.list_tasks(status=TaskStatus.CANCELLED, limit=TASKS + 1):
            service.retry_task(task.task_id)
        return service.count_by_status()[TaskStatus.COMPLETED] == TASKS + 1

    wait_until(all_completed, LEASE * 3 + 90, "the drain did not finish", logs=workers.logs)
    # Nothing was killed or frozen: no task may have run twice (a cancelled task never ran, a
    # running sync one whose cancel was requested completed), let alone twice at once; except
    # that a running async one is stopped by its cancel (its coroutine cancelled) and so runs
    # again once retried.
    stopped = {
        (r["task"], r["attempt"], r["pid"]) for r in journal.records() if r["event"] == "cancelled"
    }

    def stopped_by_its_cancel(earlier: Run, later: Run) -> bool:
        return (earlier.task, earlier.attempt, earlier.pid) in stopped

    problems = check_runs(
        journal, faults, service, [HELD, *ids], repeat_allowed=stopped_by_its_cancel
    )
    assert (HELD, 1, held_pid) in stopped, "the held async handler's coroutine was not cancelled"
    assert not problems, "\n".join(problems[:20])
    lost = [
        t.task_id
        for t in service.list_tasks(limit=TASKS + 1)
        if "worker lost" in (t.last_error or "")
    ]
    assert not lost, f"worker lost reported for living workers: {lost}\n{workers.logs()}"
    for process in started:
        process.terminate()
    for process in started:
        assert process.wait(20) == 0, process.log()


def _submit(service, ids: list[str]) -> None:
    """The held task first (so it is claimed early), then the racing ones."""
    service.submit_many(
        [
            TaskSubmitRequest(
                ASYNC, {"sleep": HELD_SLEEP, "sleep_attempts": 1}, task_id=HELD, retry_limit=5
            ),
            *(
                TaskSubmitRequest(
                    ASYNC if n % 3 == 0 else "demo.journal",
                    {"sleep": 0.3},
                    task_id=i,
                    retry_limit=5,
                )
                for n, i in enumerate(ids)
            ),
        ]
    )


def _cancel_and_retry_at_random(
    service, rng: random.Random, acted: dict[str, int], stop: threading.Event
) -> None:
    """Cancel, and mostly retry at once, tasks that are waiting, claimed or running."""
    deadline = time.monotonic() + CHAOS_SECONDS
    while time.monotonic() < deadline and not stop.is_set():
        tasks = service.list_tasks(limit=TASKS + 1)
        # The held task is the test thread's to cancel, once it runs.
        live = [t for t in tasks if not t.status.is_terminal and t.task_id != HELD]
        if not live:
            break
        # Mostly a claimed task not started yet: the window the stale start races in.
        claimed = [t for t in live if t.worker_id and t.status is not TaskStatus.RUNNING]
        # Now and then an async one under way: a cancel then cancels its coroutine.
        awaiting = [t for t in live if t.status is TaskStatus.RUNNING and t.task_name == ASYNC]
        draw = rng.random()
        if awaiting and draw < 0.15:
            task_id = rng.choice(awaiting).task_id
        else:
            task_id = rng.choice(claimed if claimed and draw < 0.7 else live).task_id
        if service.cancel_task(task_id):
            acted["cancelled"] += 1
        time.sleep(rng.choice((0, 0, 0, 0.002, 0.02)))
        if rng.random() < 0.8 and service.retry_task(task_id):
            acted["retried"] += 1
        time.sleep(rng.uniform(0, 0.01))


def _cancel_the_held_task_once_running(service, journal, logs) -> int:
    """Cancel the held task once its handler has written "start" (so it surely runs, and awaits
    for HELD_SLEEP seconds), wait for its handler to stop either way; returns its pid."""
    [start] = wait_until(
        lambda: journal.events(HELD, "start"), 120, "the held task never started", logs=logs
    )
    assert start["attempt"] == 1, start
    assert service.cancel_task(HELD), "the cancel of the running held task changed nothing"
    # Its handler ends with "cancelled" when the cancel reaches its coroutine, or with "end"
    # HELD_SLEEP seconds later when it does not; the check of which is the caller's.
    wait_until(
        lambda: journal.events(HELD, "finally"),
        HELD_SLEEP + 60,
        "the held handler never returned",
        logs=logs,
    )
    return start["pid"]


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_retry_waits_for_the_handler_of_a_timed_out_attempt(
    alias, key_prefix, workers, journal, faults
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    started = [
        workers.start(backend, wait_ready=False, env=journal.env(), **FAST) for _ in range(2)
    ]
    for process in started:
        process.wait_ready()
    # The first attempt sleeps 8 s and ignores cancellation; its deadline is 3 s after submit.
    service.submit(
        "demo.journal",
        {"sleep": 8, "sleep_attempts": 1},
        task_id="late",
        max_duration_millis=3000,
        retry_limit=0,
    )
    wait_until(lambda: "late" in journal.runs(), 30, "the task never started", logs=workers.logs)
    wait_until(
        lambda: service.get_task("late").status is TaskStatus.TIMEOUT,
        60,
        "the task did not time out",
        logs=workers.logs,
    )
    [first] = journal.runs()["late"]
    holder = next(p.worker_id for p in started if p.pid == first.pid)

    # While the handler runs, every retry is refused, naming the worker it runs on. The worker
    # lets the lease go as soon as the handler returns (handler_returned), so a retry may go
    # through right after the journal's "end": one accepted must find that "end" written.
    refusals, deadline = 0, time.monotonic() + LEASE * 3 + 30
    while (reason := service.retry_task_or_reason("late")) is not None:
        assert f"still running on worker {holder}" in reason, reason
        if journal.runs()["late"][0].end is None:
            refusals += 1
        assert time.monotonic() < deadline, f"the retry was never accepted: {reason}"
        time.sleep(0.3)
    assert journal.runs()["late"][0].end is not None, "retried while the timed-out handler runs"
    assert refusals >= 3
    wait_until(
        lambda: service.get_task("late").status is TaskStatus.COMPLETED,
        60,
        "the retried task did not complete",
        logs=workers.logs,
    )
    runs = journal.runs()["late"]
    assert [run.attempt for run in runs] == [1, 2]
    assert runs[0].end is not None and runs[0].end <= runs[1].start
    # The second run is the manual retry's, not a repeat while a worker lived.
    problems = check_runs(
        journal, faults, service, ["late"], repeat_allowed=lambda earlier, later: True
    )
    assert not problems, "\n".join(problems)
    assert service.get_task("late").attempts == 2
    for process in started:
        process.terminate()
    for process in started:
        assert process.wait(20) == 0, process.log()
