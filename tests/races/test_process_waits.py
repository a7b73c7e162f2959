"""Durable waits with real workers, on every storage, read from the handlers' own journal: a
sleep gives its worker slot back and resumes on time (in a pool thread, on the event loop and
in a process pool's child); an event sent while no worker runs resumes the task once one
starts; a wait for tasks resumes only after their handlers returned (docs/guarantees.md: a
TIMEOUT whose handler still runs has not ended); a SIGTERM hands a task that uses steps back at
its next step, and another worker finishes it without redoing a finished step."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import Journal
from tests.support.processes import FAST, Backend, service_for, wait_until

ONE_SLOT = ("--core-pool-size", "1", "--max-pool-size", "1")


@pytest.fixture
def journal(tmp_path) -> Journal:
    return Journal(tmp_path / "journal.jsonl")


def ended(service, task_id, timeout, logs):
    return wait_until(
        lambda: (t := service.get_task(task_id)) is not None and t.is_terminal and t,
        timeout,
        f"task {task_id} did not end",
        logs=logs,
    )


# A pool thread on every storage; the event loop and a process pool's child (which reach the
# storage through the same suspend) on SQLite, to keep CI's time.
SLEEP_CASES = [
    *((alias, "demo.waits", "thread") for alias in BACKENDS),
    ("default", "demo.async_waits", "thread"),
    ("default", "demo.waits", "process"),
]


@pytest.mark.parametrize(
    "alias,handler,pool",
    [
        pytest.param(
            *case,
            id=f"{db_params([case[0]])[0].id}-{case[2]}-{case[1]}",
            marks=db_params([case[0]])[0].marks,
        )
        for case in SLEEP_CASES
    ],
)
def test_a_sleep_frees_its_slot_and_resumes_on_time(
    alias, handler, pool, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    workers.start(backend, *ONE_SLOT, "--pool", pool, env=journal.env(), **FAST)
    service.submit(handler, {"wait": "sleep", "seconds": 2}, task_id="sleeper")
    first = wait_until(
        lambda: journal.events("sleeper", "start"), 30, "never started", logs=workers.logs
    )[0]
    # While it sleeps, its one slot runs other work.
    service.submit("demo.journal", {}, task_id="other")
    other = ended(service, "other", 30, workers.logs)
    assert other.status is TaskStatus.COMPLETED
    done = ended(service, "sleeper", 30, workers.logs)
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert (done.attempts, done.resumptions) == (1, 1)
    assert done.result["steps"] == ["before@0", "after@1"]
    # From the handlers' own records: "before" ran once, "after" once; the handler was called
    # twice, the second time no earlier than the sleep's end.
    steps = [r["step"] for r in journal.events("sleeper", "step")]
    assert steps == ["before", "after"]
    starts = journal.events("sleeper", "start")
    assert [r["resumptions"] for r in starts] == [0, 1]
    assert starts[1]["t"] >= first["t"] + 2 - 0.05
    other_start = journal.events("other", "start")[0]["t"]
    assert other_start < starts[1]["t"]


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_an_event_sent_while_no_worker_runs_resumes_the_task_once_one_starts(
    alias, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    worker = workers.start(backend, env=journal.env(), **FAST)
    service.submit("demo.waits", {"wait": "event"}, task_id="evt")
    wait_until(
        lambda: (t := service.get_task("evt")) and t.waiting, 30, "never waited", logs=workers.logs
    )
    worker.terminate()
    assert worker.wait(30) == 0
    assert service.send_event("evt", "go", {"n": 1}) is True
    assert service.send_event("evt", "go", {"n": 2}) is True  # the first payload is kept
    workers.start(backend, env=journal.env(), **FAST)
    done = ended(service, "evt", 30, workers.logs)
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert done.result["event"] == {"n": 1}
    assert [r["got"] for r in journal.events("evt", "resumed")] == [{"event": {"n": 1}}]


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_wait_for_tasks_resumes_only_after_their_handlers_returned(
    alias, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    workers.start(backend, env=journal.env(), **FAST)
    # The child times out after 1 s (max_duration) while its handler sleeps 3 s more: it is
    # TIMEOUT at once, but has ended only once the handler returned.
    service.submit(
        "demo.journal",
        {"sleep": 4, "sleep_attempts": 1},
        task_id="child",
        max_duration_millis=1000,
    )
    service.submit("demo.waits", {"wait": "tasks", "task_ids": ["child"]}, task_id="parent")
    done = ended(service, "parent", 60, workers.logs)
    assert done.status is TaskStatus.COMPLETED, done.last_error
    assert done.result["ended"] == {"child": "TIMEOUT"}
    child_end = journal.events("child", "end")[0]["t"]
    resumed = journal.events("parent", "resumed")
    assert len(resumed) == 1 and resumed[0]["t"] >= child_end


# A pool thread on every storage; the event loop and a process pool's child on Redis.
SIGTERM_CASES = [
    *((alias, "demo.steps", "thread") for alias in BACKENDS),
    ("redis", "demo.async_steps", "thread"),
    ("redis", "demo.steps", "process"),
]


@pytest.mark.parametrize(
    "alias,handler,pool",
    [
        pytest.param(
            *case,
            id=f"{db_params([case[0]])[0].id}-{case[2]}-{case[1]}",
            marks=db_params([case[0]])[0].marks,
        )
        for case in SIGTERM_CASES
    ],
)
def test_sigterm_hands_a_stepping_task_back_at_its_next_step(
    alias, handler, pool, key_prefix, workers, journal
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    first = workers.start(backend, "--pool", pool, env=journal.env(), **FAST)
    # Step "two" sleeps 2 s in its first attempt; the SIGTERM comes meanwhile.
    service.submit(handler, {"hang": "two", "sleep": 2}, task_id="deploy")
    wait_until(
        lambda: journal.events("deploy", "hang"), 30, "never reached step two", logs=workers.logs
    )
    began = time.monotonic()
    first.terminate()
    assert first.wait(30) == 0
    # The worker did not wait for step three: it stopped once step two returned.
    assert time.monotonic() - began < 10
    handed = service.get_task("deploy")
    assert handed.status is TaskStatus.PENDING, handed.last_error
    assert [s.name for s in handed.steps] == ["one", "two"]
    assert (handed.attempts, handed.resumptions) == (0, 1)
    workers.start(backend, "--pool", pool, env=journal.env(), **FAST)
    done = ended(service, "deploy", 30, workers.logs)
    assert done.status is TaskStatus.COMPLETED, done.last_error
    # Each step ran once, from the handlers' own records; three in the second worker.
    ran = [(r["pid"], r["step"]) for r in journal.events("deploy", "step")]
    assert [step for _, step in ran] == ["one", "two", "three"]
    assert ran[2][0] != ran[1][0]  # another process (worker, or its child) ran step three
    assert done.result == ["one@1", "two@1", "three@1"]


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_cancel_of_a_waiting_task_ends_it_cancelled_at_once(alias, key_prefix, workers, journal):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    workers.start(backend, env=journal.env(), **FAST)
    service.submit("demo.waits", {"wait": "event"}, task_id="stop-me")
    wait_until(
        lambda: (t := service.get_task("stop-me")) and t.waiting,
        30,
        "never waited",
        logs=workers.logs,
    )
    assert service.cancel_task("stop-me") is True
    task = service.get_task("stop-me")
    assert task.status is TaskStatus.CANCELLED and task.waiting is None
    assert service.send_event("stop-me", "go") is False  # it has ended: nothing stored
    time.sleep(1.0)  # the worker had every chance to run it again
    assert len(journal.events("stop-me", "start")) == 1
    assert journal.events("stop-me", "resumed") == []
