"""Poison results among a drain: a handler, sync or async, returns a value no storage can take
(an integer over Python's int-to-str digit limit, a list nested 100,000 deep). The task fails
alone, once, with an error naming why; every other completion is written promptly, long before
any lease could lapse; and the worker still stops cleanly."""

from __future__ import annotations

import time

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import check_runs
from tests.support.processes import Backend, service_for, wait_until

LEASE = 30.0  # recovery cannot rescue anything within the test: every outcome is the worker's
PROMPT = 20.0  # seconds in which every task must be terminal
TASKS = 200
POISON = {"bigint": "is an integer too long", "deep": "nested too deeply"}
HANDLERS = ("demo.journal", "demo.async_journal")  # a pool thread's, the event loop's


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_poison_results_fail_alone_and_hold_nothing_up(alias, key_prefix, workers, journal, faults):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    normal = [f"normal-{i:03d}" for i in range(TASKS)]
    poison = {
        f"poison-{name.split('.')[1]}-{kind}-{i}": (name, kind)
        for i in range(3)
        for kind in POISON
        for name in HANDLERS
    }
    requests = [
        TaskSubmitRequest(HANDLERS[n % 2], {}, task_id=task_id) for n, task_id in enumerate(normal)
    ]
    # Spread among the others, so their completions would share a batch with the poison's.
    for n, (task_id, (name, kind)) in enumerate(poison.items()):
        requests.insert(
            (n + 1) * TASKS // (len(poison) + 1),
            TaskSubmitRequest(name, {"poison": kind}, task_id=task_id, retry_limit=3),
        )
    service.submit_many(requests)

    worker = workers.start(
        backend, env=journal.env(), lease_timeout=LEASE, master_lock_ttl=5.0, wait_ready=False
    )
    worker.wait_ready()
    ready = time.monotonic()
    wait_until(
        lambda: (
            service.count_by_status()[TaskStatus.RUNNING]
            + service.count_by_status()[TaskStatus.CREATED]
            == 0
        ),
        PROMPT + 30,
        "tasks still waiting or running",
        logs=workers.logs,
    )
    took = time.monotonic() - ready
    assert took < PROMPT, f"the drain took {took:.1f}s: completions were held up"

    problems = check_runs(journal, faults, service, normal)
    problems += check_runs(journal, faults, service, poison, expected=TaskStatus.FAILED)
    assert not problems, "\n".join(problems[:20])
    runs = journal.runs()
    for task_id, (_, kind) in poison.items():
        info = service.get_task(task_id)
        assert info.last_error.startswith("result cannot be stored: "), info.last_error
        assert POISON[kind] in info.last_error, info.last_error
        assert (info.attempts, info.result) == (1, None)  # deterministic: not retried
        assert len(runs[task_id]) == 1, runs[task_id]

    worker.terminate()
    assert worker.wait(30) == 0, worker.log()
