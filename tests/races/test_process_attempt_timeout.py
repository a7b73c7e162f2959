"""attempt_timeout under real runexecutor processes on every storage, read from the handlers'
own journal (RE_JOURNAL): in pool threads a timed-out attempt is asked to stop and is retried
only once its handler returned, whether it stopped at once or ran on; under ``--pool process``
its child is terminated at the limit and replaced; on the event loop its coroutine is
cancelled. Limits of 1 s, so each test takes seconds."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import Journal, Run
from tests.support.processes import Backend, pid_gone, service_for, wait_until

LIMIT = 1.0  # seconds: every timed-out attempt here has this attempt_timeout
THREADS = ("--core-pool-size", "4", "--max-pool-size", "4", "--queue-capacity", "4")
CHILDREN = ("--pool", "process", "--max-pool-size", "2")
ONE_THREAD = ("--core-pool-size", "1", "--max-pool-size", "1", "--queue-capacity", "0")
TIMED_OUT = f"attempt timed out after {LIMIT:g} s"


@pytest.fixture
def journal(tmp_path) -> Journal:
    return Journal(tmp_path / "journal.jsonl")


def _ended(service, ids, timeout, logs):
    """Wait until every task of ``ids`` is terminal and its handler has returned (it ended);
    their TaskInfos by id."""

    def check():
        tasks = {i: service.get_task(i) for i in ids}
        done = all(
            t is not None and t.is_terminal and not t.handler_running for t in tasks.values()
        )
        return tasks if done else None

    return wait_until(check, timeout, f"tasks {ids} did not all end", logs=logs)


def _one_after_the_other(runs: list[Run], ended: dict[tuple[int, int], float]) -> None:
    """Each run began only after the run before it had ended (``ended``: when a run that has
    no "end" record stopped, by (attempt, pid))."""
    for earlier, later in zip(runs, runs[1:], strict=False):
        stop = earlier.end if earlier.end is not None else ended[(earlier.attempt, earlier.pid)]
        assert later.start >= stop, (earlier, later)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_thread_attempt_past_its_limit_is_retried_only_once_its_handler_returned(
    alias, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit_many(
        [
            # Sleeps 30 s checking is_cancelled(): stops at the limit, retried, then quick.
            TaskSubmitRequest(
                "demo.cooperative",
                {"sleep": 30, "sleep_attempts": 1},
                task_id="cooperative",
                attempt_timeout=LIMIT,
                retry_limit=2,
            ),
            # Ignores is_cancelled() and sleeps 3 s: no second attempt before it returns.
            TaskSubmitRequest(
                "demo.journal",
                {"sleep": 3, "sleep_attempts": 1},
                task_id="stubborn",
                attempt_timeout=LIMIT,
                retry_limit=1,
            ),
            # The same without retries: FAILED, once it returned.
            TaskSubmitRequest(
                "demo.journal",
                {"sleep": 2},
                task_id="exhausted",
                attempt_timeout=LIMIT,
                retry_limit=0,
            ),
            # Waits for "stubborn": a timed-out attempt that is retried has not ended.
            TaskSubmitRequest("demo.journal", {}, task_id="dependent", depends_on=["stubborn"]),
            # Returns well within its limit: an ordinary success.
            TaskSubmitRequest(
                "demo.cooperative", {"sleep": 0.2}, task_id="in-time", attempt_timeout=5
            ),
        ]
    )
    workers.start(backend, *THREADS, env=journal.env())

    # Past its limit and still running: RUNNING, one attempt, no second start.
    wait_until(
        lambda: (r := journal.runs().get("stubborn")) and time.time() - r[0].start > LIMIT + 0.5,
        30,
        "stubborn never ran past its limit",
        logs=workers.logs,
    )
    stubborn = service.get_task("stubborn")
    assert (stubborn.status, stubborn.attempts) == (TaskStatus.RUNNING, 1), stubborn
    assert len(journal.runs()["stubborn"]) == 1

    ids = ["cooperative", "stubborn", "exhausted", "dependent", "in-time"]
    tasks = _ended(service, ids, 60, workers.logs)
    runs = journal.runs()

    cooperative = tasks["cooperative"]
    assert (cooperative.status, cooperative.attempts, cooperative.result) == (
        TaskStatus.COMPLETED,
        2,
        2,
    )
    [cancelled] = journal.events("cooperative", "cancelled")
    assert journal.events("cooperative", "end")[0]["attempt"] == 2
    first, second = runs["cooperative"]
    assert first.end == cancelled["t"]  # (the journal's runs end at any record but a start)
    # Asked to stop at the limit (is_cancelled() turned True), not long after.
    assert LIMIT - 0.1 <= cancelled["t"] - first.start < LIMIT + 3  # (armed just before)
    _one_after_the_other(runs["cooperative"], {})

    stubborn = tasks["stubborn"]
    assert (stubborn.status, stubborn.attempts) == (TaskStatus.COMPLETED, 2), stubborn
    first, second = runs["stubborn"]
    assert first.end - first.start >= 3  # it ran on to its end, past the limit
    _one_after_the_other(runs["stubborn"], {})

    exhausted = tasks["exhausted"]
    assert (exhausted.status, exhausted.attempts) == (TaskStatus.FAILED, 1), exhausted
    assert exhausted.last_error.startswith(TIMED_OUT), exhausted.last_error
    assert "the handler returned after 2." in exhausted.last_error
    [run] = runs["exhausted"]
    assert run.end is not None and exhausted.finished_at.timestamp() >= run.end

    # The dependent started only after stubborn's second attempt had returned.
    [dependent] = runs["dependent"]
    assert dependent.start >= runs["stubborn"][1].end
    assert tasks["dependent"].status is TaskStatus.COMPLETED

    in_time = tasks["in-time"]
    assert (in_time.status, in_time.attempts, in_time.last_error) == (
        TaskStatus.COMPLETED,
        1,
        None,
    )
    assert in_time.attempt_timeout == 5.0
    assert workers.started[0].alive()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_the_process_pool_terminates_a_child_at_the_limit_and_replaces_it(
    alias, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit_many(
        [
            # Holds its child's GIL in one C call for a minute, every attempt.
            TaskSubmitRequest(
                "demo.journal",
                {"spin": 60},
                task_id="spinning",
                attempt_timeout=LIMIT,
                retry_limit=1,
            ),
            # Only its first attempt spins: terminated, retried, then completes.
            TaskSubmitRequest(
                "demo.journal",
                {"spin": 60, "spin_attempts": 1},
                task_id="spins-once",
                attempt_timeout=LIMIT,
                retry_limit=1,
            ),
        ]
    )
    worker = workers.start(backend, *CHILDREN, env=journal.env())
    tasks = _ended(service, ["spinning", "spins-once"], 90, workers.logs)
    runs = journal.runs()

    spinning = tasks["spinning"]
    assert (spinning.status, spinning.attempts) == (TaskStatus.FAILED, 2), spinning
    assert spinning.last_error.startswith(TIMED_OUT), spinning.last_error
    assert "the child process running the handler was terminated" in spinning.last_error
    first, second = runs["spinning"]
    assert first.end is None and second.end is None
    # Each in a child of its own, gone now; the second began once the first was terminated.
    assert len({first.pid, second.pid, worker.pid}) == 3
    assert pid_gone(first.pid) and pid_gone(second.pid)
    assert second.start >= first.start + LIMIT
    # Terminated at the limit, not after the minute its spin would take.
    assert spinning.finished_at.timestamp() - second.start < LIMIT + 10

    spins_once = tasks["spins-once"]
    assert (spins_once.status, spins_once.attempts) == (TaskStatus.COMPLETED, 2), spins_once
    first, second = runs["spins-once"]
    assert first.end is None and second.end is not None and first.pid != second.pid
    assert second.start >= first.start + LIMIT
    assert worker.alive()
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_the_event_loop_cancels_a_coroutine_at_the_limit(alias, key_prefix, workers, journal):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    service.submit(
        "demo.async_journal",
        {"sleep": 30, "sleep_attempts": 1},
        task_id="awaiting",
        attempt_timeout=LIMIT,
        retry_limit=1,
    )
    service.submit(
        "demo.async_journal", {"sleep": 30}, task_id="always", attempt_timeout=LIMIT, retry_limit=0
    )
    # Catches its CancelledError and awaits on for 3 s: no second attempt before it returns.
    service.submit(
        "demo.async_outlive",
        {"seconds": 3, "first_only": True},
        task_id="outliving",
        attempt_timeout=LIMIT,
        retry_limit=1,
    )
    workers.start(backend, *ONE_THREAD, env=journal.env())
    tasks = _ended(service, ["awaiting", "always", "outliving"], 60, workers.logs)
    runs = journal.runs()

    awaiting = tasks["awaiting"]
    assert (awaiting.status, awaiting.attempts, awaiting.result) == (TaskStatus.COMPLETED, 2, 2)
    [cancelled] = journal.events("awaiting", "cancelled")
    finally_records = journal.events("awaiting", "finally")
    assert [r["attempt"] for r in finally_records] == [1, 2]
    first, second = runs["awaiting"]
    # CancelledError at its await, at the limit; its finally ran before the retry began.
    assert LIMIT - 0.1 <= cancelled["t"] - first.start < LIMIT + 3  # (armed just before)
    assert second.start >= finally_records[0]["t"]

    always = tasks["always"]
    assert (always.status, always.attempts) == (TaskStatus.FAILED, 1), always
    assert always.last_error.startswith(TIMED_OUT), always.last_error
    assert "its coroutine was cancelled" in always.last_error

    outliving = tasks["outliving"]
    assert (outliving.status, outliving.attempts) == (TaskStatus.COMPLETED, 2), outliving
    [ignored] = journal.events("outliving", "cancelled")
    [first_end, _] = journal.events("outliving", "end")
    first, second = runs["outliving"]
    assert LIMIT - 0.1 <= ignored["t"] - first.start < LIMIT + 3
    assert first_end["t"] - first.start >= 3  # it awaited on, past the limit
    assert second.start >= first_end["t"]
