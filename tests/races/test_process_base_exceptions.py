"""runexecutor as a subprocess with handlers that raise BaseException (SystemExit,
KeyboardInterrupt): the attempt fails as any exception's does, and the pool thread, the event
loop and the process pool's child run the next tasks; a loop killed from outside any handler
is noticed, its task failed (and retried) and the loop started again."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import LEASE, Backend, read_journal, service_for, wait_until

# One pool thread: should it die, nothing after it would ever run.
ONE_THREAD = ("--core-pool-size", "1", "--max-pool-size", "1", "--queue-capacity", "0")
ONE_CHILD = ("--pool", "process", "--max-pool-size", "1", "--queue-capacity", "0")
ENDED = {TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.TIMEOUT, TaskStatus.ERROR}


def journal_records(path: Path, event: str) -> list[dict]:
    records = read_journal(path)
    return [r for r in records if r["event"] == event]


def wait_ended(service, task_ids, logs, timeout=60):
    def ended() -> bool:
        return all(service.get_task(i).status in ENDED for i in task_ids)

    wait_until(ended, timeout, f"tasks {task_ids} did not all end", logs=logs)
    return {i: service.get_task(i) for i in task_ids}


def submit_exits(service, handler: str, kind: str, prefix: str, **param) -> tuple[str, str]:
    """Two tasks of ``handler`` raising ``kind``: one in its first attempt only, one in every
    attempt (it gets one retry)."""
    once, always = f"{prefix}-once", f"{prefix}-always"
    service.submit_many(
        [
            TaskSubmitRequest(handler, {"raise": kind, **param}, task_id=once),
            TaskSubmitRequest(
                handler,
                {"raise": kind, "exit_attempts": 99, **param},
                task_id=always,
                retry_limit=1,
            ),
        ]
    )
    return once, always


def run_after(service, prefix: str) -> list[str]:
    """Tasks submitted once the exits ended: a sync and an async one, to show the pool thread
    and the event loop (or the child) still run what comes."""
    ids = [f"{prefix}-after-sync", f"{prefix}-after-async"]
    service.submit_many(
        [
            TaskSubmitRequest("demo.echo", "still here", task_id=ids[0]),
            TaskSubmitRequest("demo.async_sleep", {"seconds": 0}, task_id=ids[1]),
        ]
    )
    return ids


@pytest.mark.parametrize("alias", db_params(BACKENDS))
@pytest.mark.parametrize("pool", ["thread", "process"])
def test_handlers_raising_base_exceptions_fail_their_attempts(
    alias, pool, key_prefix, workers, tmp_path
):
    """demo.exits (sync) raises SystemExit or KeyboardInterrupt, both in its retry_on: a
    first attempt that raises fails with the exception's name in last_error and is retried;
    one raising every time ends FAILED after its one retry. demo.async_exits (default
    retry_on: Exception) does the same on the event loop (or in a child): FAILED at once.
    The only pool thread (or child) and the loop then run the next tasks."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    workers.start(
        backend,
        *(ONE_THREAD if pool == "thread" else ONE_CHILD),
        env={"RE_JOURNAL": str(journal)},
    )
    sync, unretried = [], []
    for kind in ("SystemExit", "KeyboardInterrupt"):
        sync.append((kind, *submit_exits(service, "demo.exits", kind, f"sync-{kind}")))
        unretried.append((kind, *submit_exits(service, "demo.async_exits", kind, f"async-{kind}")))
    every = [i for _, once, always in sync + unretried for i in (once, always)]
    ended = wait_ended(service, every, workers.logs)
    for kind, once, always in sync:
        assert ended[once].status is TaskStatus.COMPLETED, (ended[once], workers.logs())
        assert ended[once].attempts == 2 and ended[once].result == 2
        assert ended[always].status is TaskStatus.FAILED, (ended[always], workers.logs())
        assert ended[always].attempts == 2
        assert kind in (ended[always].last_error or ""), ended[always].last_error
    for kind, once, always in unretried:
        for info in (ended[once], ended[always]):
            assert info.status is TaskStatus.FAILED, (info, workers.logs())
            assert info.attempts == 1, info  # not in its retry_on: no retry
            assert kind in (info.last_error or ""), info.last_error
    # The handlers' own records: every attempt began, and only once.
    starts = sorted((r["task"], r["attempt"]) for r in journal_records(journal, "start"))
    expected = [(i, 1) for _, once, always in unretried for i in (once, always)]
    expected += [(i, n) for _, once, always in sync for i in (once, always) for n in (1, 2)]
    assert starts == sorted(expected)
    after = wait_ended(service, run_after(service, "after"), workers.logs)
    assert {info.status for info in after.values()} == {TaskStatus.COMPLETED}, workers.logs()
    service.storage.close()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_an_event_loop_killed_outside_any_handler_is_replaced(alias, key_prefix, workers, tmp_path):
    """demo.async_exits with ``kill_loop`` makes a callback of the loop raise SystemExit, which
    ends the loop's thread under it and under a demo.async_sleep awaiting beside it. The
    heartbeat finds the loop dead: both attempts fail (retryable, the loop's death in
    last_error's place in the log) and are retried on a new loop, where they complete; async
    tasks after them complete too."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    worker = workers.start(
        backend, *ONE_THREAD, lease_timeout=LEASE, env={"RE_JOURNAL": str(journal)}
    )
    service.submit("demo.async_sleep", {"seconds": 2}, task_id="beside")
    wait_until(lambda: journal_records(journal, "start"), 30, "no start", logs=workers.logs)
    service.submit("demo.async_exits", {"kill_loop": True, "sleep": 30}, task_id="killer")
    ended = wait_ended(service, ["beside", "killer"], workers.logs)
    for info in ended.values():
        assert info.status is TaskStatus.COMPLETED, (info, workers.logs())
        assert info.attempts == 2, (info, workers.logs())
    assert "the worker's event loop died: SystemExit" in worker.log()
    starts = sorted((r["task"], r["attempt"]) for r in journal_records(journal, "start"))
    assert starts == [("beside", 1), ("beside", 2), ("killer", 1), ("killer", 2)]
    after = wait_ended(service, run_after(service, "after"), workers.logs)
    assert {info.status for info in after.values()} == {TaskStatus.COMPLETED}, workers.logs()
    service.storage.close()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_pool_thread_killed_in_the_workers_code_is_replaced(alias, key_prefix, workers, tmp_path):
    """demo.kills_its_thread has SystemExit raised in its pool thread once it returned, in the
    worker's own code: the only pool thread dies, a new one takes its place and runs the tasks
    that come next."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    worker = workers.start(backend, *ONE_THREAD, env={"RE_JOURNAL": str(journal)})
    first = service.submit("demo.kills_its_thread", {}).task_id
    [info] = wait_ended(service, [first], workers.logs).values()
    assert info.status is TaskStatus.COMPLETED, (info, workers.logs())
    wait_until(
        lambda: "pool thread running the task died" in worker.log(),
        30,
        "the pool thread did not die",
        logs=workers.logs,
    )
    second = service.submit("demo.kills_its_thread", {}).task_id
    [info] = wait_ended(service, [second], workers.logs).values()
    assert info.status is TaskStatus.COMPLETED, (info, workers.logs())
    threads = {r["task"]: r["thread"] for r in journal_records(journal, "start")}
    assert threads[first] != threads[second]  # a new thread ran it
    after = wait_ended(service, run_after(service, "after"), workers.logs)
    assert {info.status for info in after.values()} == {TaskStatus.COMPLETED}, workers.logs()
    service.storage.close()


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_health_reports_a_worker_whose_event_loop_runs_nothing(
    alias, key_prefix, workers, tmp_path
):
    """demo.async_journal with ``block`` holds the event loop in time.sleep for 8 s: past
    LEASE_TIMEOUT / 2 the heartbeat finds the loop answering nothing, and the worker stops
    registering (its leases still renewed), so `executor health --worker-id` fails once
    --max-age passes, naming the worker; it is healthy again once the loop runs."""
    from tests.support.commands import manage, process_env

    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    worker = workers.start(
        backend, *ONE_THREAD, lease_timeout=LEASE, env={"RE_JOURNAL": str(journal)}
    )
    wait_until(lambda: service.master() == worker.worker_id, 30, "no master", logs=workers.logs)
    env = process_env(backend)
    probe = ("health", "--worker-id", worker.worker_id, "--max-age", "1")
    healthy = manage(env, *probe)
    assert healthy.returncode == 0, (healthy, workers.logs())
    service.submit("demo.async_journal", {"block": 8}, task_id="hog")

    def unhealthy():
        result = manage(env, *probe)
        return result if result.returncode == 1 else None

    result = wait_until(unhealthy, 30, "health did not report the blocked loop", logs=workers.logs)
    assert result.stdout.startswith(f"unhealthy: worker {worker.worker_id} heartbeated "), result
    assert "more than --max-age 1s" in result.stdout, result
    assert "event loop has run nothing for" in worker.log()
    [hog] = wait_ended(service, ["hog"], workers.logs).values()
    assert hog.status is TaskStatus.COMPLETED and hog.attempts == 1, (hog, workers.logs())
    wait_until(
        lambda: manage(env, *probe).returncode == 0,
        30,
        "health did not recover",
        logs=workers.logs,
    )
    service.storage.close()
