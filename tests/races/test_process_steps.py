"""Durable steps under kill -9: a handler of three steps killed inside its second step, before
that step's checkpoint, resumes after its first step (which never runs again), runs the second
again and completes; read from the handlers' own journal, on every storage, in a pool thread,
on the event loop and in a process pool's child."""

from __future__ import annotations

import os
import signal

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import Journal
from tests.support.processes import FAST, Backend, executions, service_for, wait_until

SMALL_POOL = ("--core-pool-size", "1", "--max-pool-size", "1")


@pytest.fixture
def journal(tmp_path) -> Journal:
    return Journal(tmp_path / "journal.jsonl")


@pytest.mark.parametrize(
    "handler,pool",
    [("demo.steps", "thread"), ("demo.async_steps", "thread"), ("demo.steps", "process")],
    ids=["thread", "event_loop", "process"],
)
@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_handler_killed_inside_its_second_step_resumes_after_its_first(
    alias, handler, pool, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    # On a database, step two is atomic=True and writes a row: it commits with the checkpoint
    # only, so the killed attempt's row is rolled back with it.
    atomic = alias != "redis" and handler == "demo.steps"
    args = [*SMALL_POOL, "--pool", pool]
    first = workers.start(backend, *args, env=journal.env(), **FAST)
    service.submit(handler, {"hang": "two", "atomic": atomic}, task_id="steps")

    hang = wait_until(
        lambda: journal.events("steps", "hang"),
        30,
        "the handler never reached step two",
        logs=workers.logs,
    )[0]
    assert hang["step"] == "two" and hang["attempt"] == 1
    # The process running the handler: the worker itself, or its child under --pool process.
    os.kill(hang["pid"], signal.SIGKILL)
    if hang["pid"] == first.pid:
        first.wait(10)
        workers.start(backend, *args, env=journal.env(), **FAST)  # recovers the lost lease
    else:
        assert pool == "process"

    done = wait_until(
        lambda: (t := service.get_task("steps")) is not None and t.is_terminal and t,
        60,
        "the task did not end",
        logs=workers.logs,
    )
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert done.attempts == 2
    assert done.result == ["one@1", "two@2", "three@2"]
    assert [step.name for step in done.steps] == ["one", "two", "three"]

    # What the handlers themselves recorded: step one ran once, step two twice (killed in the
    # first attempt before its checkpoint), step three once; the code between steps runs in
    # every attempt (each attempt's "start", and its "after" records from where it resumed).
    ran = [(r["attempt"], r["step"]) for r in journal.events("steps", "step")]
    assert ran == [(1, "one"), (1, "two"), (2, "two"), (2, "three")]
    assert [r["attempt"] for r in journal.events("steps", "start")] == [1, 2]
    after = [(r["attempt"], r["step"]) for r in journal.events("steps", "after")]
    assert after == [(1, "one"), (2, "one"), (2, "two"), (2, "three")]
    assert [r["attempt"] for r in journal.events("steps", "end")] == [2]
    if atomic:  # the killed attempt's row went with its transaction
        rows = executions(backend, "steps:two")
        assert [row.attempt for row in rows] == [2]


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_stale_attempt_cannot_checkpoint_and_its_atomic_writes_roll_back(
    alias, key_prefix, workers, journal
):
    """Its worker frozen (SIGSTOP) inside step two past its lease, the task is recovered and
    completed by another worker; resumed, the stale attempt finishes step two's function, but
    its checkpoint is refused (LeaseLostError) and, on a database, the row it wrote after its
    freeze rolls back with it: only the live attempt's checkpoint and row are kept."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    # On SQLite an atomic step's transaction holds the database's write lock while its
    # function runs (BEGIN IMMEDIATE): frozen inside one, no other worker could write at all
    # (docs/durable-tasks.md says so). There the step is a plain one.
    atomic = alias in ("mariadb", "postgres")
    param = {"hang": "two", "sleep": 5, "atomic": atomic, "late_write": True}
    frozen = workers.start(backend, *SMALL_POOL, env=journal.env(), **FAST)
    service.submit("demo.steps", param, task_id="stale")
    hang = wait_until(
        lambda: journal.events("stale", "hang"), 30, "never reached step two", logs=workers.logs
    )[0]
    assert hang["pid"] == frozen.pid
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        workers.start(backend, *SMALL_POOL, env=journal.env(), **FAST)
        done = wait_until(
            lambda: (t := service.get_task("stale")) is not None and t.is_terminal and t,
            60,
            "the task did not end while the first worker was frozen",
            logs=workers.logs,
        )
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert done.result == ["one@1", "two@2", "three@2"]
    # The stale attempt wakes, ends its sleep, (writes its row,) and is refused.
    wait_until(
        lambda: "LeaseLostError" in frozen.log() or "discarded" in frozen.log(),
        30,
        "the stale attempt's refusal was not logged",
        logs=workers.logs,
    )
    assert service.storage.step_results("stale")["two"] == "two@2"
    stale_after = [r for r in journal.events("stale", "after") if r["attempt"] == 1]
    assert [r["step"] for r in stale_after] == ["one"]  # its step two never returned
    if atomic:
        wrote = [(r["attempt"], r["pid"]) for r in journal.events("stale", "wrote")]
        assert (1, frozen.pid) in wrote  # the stale attempt did write its row...
        rows = executions(backend, "stale:two")
        assert [row.attempt for row in rows] == [2]  # ...which rolled back with its checkpoint
    final = service.get_task("stale")
    assert final.status is TaskStatus.COMPLETED and final.result == done.result
