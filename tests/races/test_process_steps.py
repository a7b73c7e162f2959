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
