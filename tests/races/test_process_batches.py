"""runexecutor as subprocesses: batch callbacks run exactly once per batch, counted from the
callback handler's own journal, across 20 batches of 50 members that two workers finish
concurrently — one of them SIGKILLed mid-batch in one repetition (every storage)."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import (
    FAST,
    Backend,
    journal_lines,
    service_for,
    wait_until,
)

REPETITIONS = 20
MEMBERS = 50
KILLED_IN = 7  # the repetition in which a worker is SIGKILLed while it runs members


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_batch_callbacks_run_exactly_once_through_concurrency_and_a_kill(
    alias, key_prefix, workers, tmp_path
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    env = {"RE_JOURNAL": str(journal)}
    pair = [workers.start(backend, wait_ready=False, env=env, **FAST) for _ in range(2)]
    for process in pair:
        process.wait_ready()

    for rep in range(REPETITIONS):
        killing = rep == KILLED_IN
        sleep = 0.5 if killing else 0.01  # long enough, there, to be killed mid-member
        requests = [
            TaskSubmitRequest(
                "demo.journal", {"sleep": sleep, "sleep_attempts": 1}, task_id=f"b{rep}-m{i}"
            )
            for i in range(MEMBERS)
        ]
        info = service.submit_batch(
            requests,
            batch_id=f"b{rep}",
            on_complete=TaskSubmitRequest("demo.batch_report", {"kind": "complete"}),
            on_success=TaskSubmitRequest("demo.batch_report", {"kind": "success"}),
        )
        assert (info.total, info.sealed) == (MEMBERS, True)
        if killing:
            victim = wait_until(
                lambda rep=rep: next(
                    (p for p in workers.started if p.alive() and _runs_member(journal, p.pid, rep)),
                    None,
                ),
                20,
                "no worker ran a member of the batch",
                logs=workers.logs,
            )
            victim.kill()
            workers.start(backend, env=env, **FAST)  # a replacement: two run again
        wait_until(
            lambda rep=rep: len(_reports(journal, f"b{rep}")) >= 2,
            60,
            f"the callbacks of batch b{rep} did not run",
            logs=workers.logs,
        )
        batch = service.get_batch(f"b{rep}")
        assert (batch.completed, batch.pending, batch.finished) == (MEMBERS, 0, True)

    # Every worker idle for a moment: a late duplicate would have shown up by now.
    for rep in range(REPETITIONS):
        reports = _reports(journal, f"b{rep}")
        assert sorted(r["kind"] for r in reports) == ["complete", "success"], (rep, reports)
        for report in reports:
            assert service.get_task(report["task"]).status is TaskStatus.COMPLETED
    killed = [r for r in journal_lines(journal) if r["task"].startswith(f"b{KILLED_IN}-")]
    assert any(r["attempt"] == 2 for r in killed), "no member of the killed batch ran again"


def _runs_member(journal, pid: int, rep: int) -> bool:
    return any(
        r["pid"] == pid and r["event"] == "start" and r["task"].startswith(f"b{rep}-")
        for r in journal_lines(journal)
    )


def _reports(journal, batch_id: str) -> list[dict]:
    return [r for r in journal_lines(journal) if r["event"] == "report" and r["batch"] == batch_id]
