"""A dependent cancelled while it waits, then retried by hand (``manage.py executor retry``),
under a real runexecutor on every storage: it starts only after its dependency's handler
returned (by the handlers' own journal), and one whose dependency failed is refused, saying so,
and never runs."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.commands import manage, process_env
from tests.support.processes import FAST, Backend, read_journal, service_for, wait_until

POOL = ("--core-pool-size", "2", "--max-pool-size", "2", "--queue-capacity", "4")


def _journal(path) -> list[dict]:
    return read_journal(path)


def _records(path, task_id: str, event: str) -> list[dict]:
    return [r for r in _journal(path) if r["task"] == task_id and r["event"] == event]


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_retried_dependent_runs_only_after_its_dependency_ended(
    alias, key_prefix, workers, tmp_path
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal, go = tmp_path / "journal.jsonl", tmp_path / "go"
    worker = workers.start(backend, *POOL, env={"RE_JOURNAL": str(journal)}, **FAST)

    # "a" runs until the test lets it return; "b" waits for it. "f" fails; "d" waits for it.
    service.submit("demo.progress", {"go": str(go)}, task_id="a")
    service.submit("demo.journal", {}, task_id="b", depends_on=["a"])
    service.submit("demo.soak", {"fail": True}, task_id="f", retry_limit=0)
    service.submit("demo.journal", {}, task_id="d", depends_on=["f"])
    wait_until(
        lambda: (
            service.get_task("a").status is TaskStatus.RUNNING
            and service.get_task("d").status is TaskStatus.CANCELLED
        ),
        30,
        "a never started, or d was not cancelled by f's failure",
        logs=workers.logs,
    )
    assert service.cancel_task("b")

    retried = manage(process_env(backend), "retry", "b", "d")
    assert retried.returncode == 1, retried.stderr
    lines = retried.stdout.splitlines()
    assert lines[0] == "b: retried"
    assert lines[1].startswith("d: skipped: its dependency f ended FAILED"), lines
    b = service.get_task("b")
    assert b.status is TaskStatus.CREATED and b.waiting_for == ("a",)

    # A task submitted after the retry runs in the free slot; had b been made due by the
    # retry, it would have been claimed first (older, same priority) and started before it.
    service.submit("demo.journal", {}, task_id="after")
    wait_until(lambda: _records(journal, "after", "end"), 30, "after never ran", logs=workers.logs)
    assert _records(journal, "b", "start") == []

    released_at = time.time()
    go.touch()  # a's handler may return now, not before
    wait_until(
        lambda: service.get_task("b").status is TaskStatus.COMPLETED,
        30,
        "b never completed",
        logs=workers.logs,
    )
    [b_start] = _records(journal, "b", "start")
    assert b_start["t"] >= released_at
    assert service.get_task("a").status is TaskStatus.COMPLETED
    d = service.get_task("d")
    assert d.status is TaskStatus.CANCELLED and d.attempts == 0
    assert _records(journal, "d", "start") == []
    worker.terminate()
    assert worker.wait(15) == 0, worker.log()
    service.storage.close()
