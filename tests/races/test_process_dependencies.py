"""Dependencies under real runexecutor processes: with two workers, one of them SIGKILLed while it
runs a dependency, no dependent starts before every one of its dependencies ended (by the
handlers' own journal), each runs once, and every task completes."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import FAST, Backend, read_journal, service_for, wait_until

POOL = ("--core-pool-size", "2", "--max-pool-size", "2", "--queue-capacity", "4")


def _journal(path) -> list[dict]:
    return read_journal(path)


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_dependents_start_only_after_their_dependencies_end_through_a_worker_kill(
    alias, key_prefix, workers, tmp_path
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    env = {"RE_JOURNAL": str(journal)}
    pair = [workers.start(backend, *POOL, env=env, wait_ready=False, **FAST) for _ in range(2)]
    for process in pair:
        process.wait_ready()

    def step(task_id: str, param: dict | None = None, **options) -> TaskSubmitRequest:
        return TaskSubmitRequest(
            "demo.journal", param or {"sleep": 0.05}, task_id=task_id, **options
        )

    # A dependency that hangs in its first attempt (its worker is killed then), and its
    # dependents; six order -> charge -> email chains; a fan-in waiting for every e-mail.
    service.submit_many(
        [
            # Hangs in its first attempt only (its worker is killed then).
            step("crash", {"sleep": 30, "sleep_attempts": 1}, retry_interval=100, priority=10),
            step("after-crash-1", depends_on=["crash"]),
            step("after-crash-2", depends_on=["crash", "after-crash-1"]),
        ]
    )
    chains = [
        service.chain([step(f"order-{i}"), step(f"charge-{i}"), step(f"email-{i}")])
        for i in range(6)
    ]
    service.submit_task(step("report", depends_on=[f"email-{i}" for i in range(6)]))
    depends = {"after-crash-1": ["crash"], "after-crash-2": ["crash", "after-crash-1"]}
    for i in range(6):
        depends[f"charge-{i}"] = [f"order-{i}"]
        depends[f"email-{i}"] = [f"charge-{i}"]
    depends["report"] = [f"email-{i}" for i in range(6)]
    assert all(len(chain) == 3 for chain in chains)

    running = wait_until(
        lambda: next((r for r in _journal(journal) if r["task"] == "crash"), None),
        30,
        "the crash task never started",
        logs=workers.logs,
    )
    (victim,) = [p for p in pair if p.pid == running["pid"]]
    victim.kill()
    (survivor,) = [p for p in pair if p is not victim]

    ids = ["crash", *depends]
    wait_until(
        lambda: all(service.get_task(i).status is TaskStatus.COMPLETED for i in ids),
        90,
        "not every task completed",
        logs=workers.logs,
    )
    records = _journal(journal)
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    killed: dict[str, int] = {}  # starts in the killed worker (its handler may not have ended)
    for record in records:
        (starts if record["event"] == "start" else ends).setdefault(record["task"], []).append(
            record["t"]
        )
        if record["event"] == "start" and record["pid"] == victim.pid:
            killed[record["task"]] = killed.get(record["task"], 0) + 1
    assert len(starts["crash"]) == 2 and len(ends["crash"]) == 1  # killed once, then ran
    for dependent, dependencies in depends.items():
        # Ran once, or twice when the killed worker was running it (its outcome lost with it):
        # at most one start in each worker, and one run ended at least.
        in_victim = killed.get(dependent, 0)
        assert in_victim <= 1 and len(starts[dependent]) - in_victim <= 1, (
            dependent,
            starts[dependent],
        )
        assert ends.get(dependent), dependent
        for dependency in dependencies:
            assert min(starts[dependent]) >= max(ends[dependency]), (dependent, dependency)
        info = service.get_task(dependent)
        assert info.depends_on == tuple(dependencies) and info.waiting_for == ()
    survivor.terminate()
    assert survivor.wait(15) == 0, survivor.log()
    service.storage.close()
