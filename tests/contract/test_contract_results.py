"""Results and parameters the storage cannot take: the task fails alone, with a clear error, and
every other completion or submit is written; large values are split across statements."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.serialization import encode
from django_reliable_executor.exceptions import ParameterTooLargeError
from django_reliable_executor.worker.runner import TaskRunner
from tests.conftest import db_params, require
from tests.support.contract_support import HOOKS, LEASE, run_claims, run_next

MIB = 1024 * 1024


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def test_a_result_with_an_integer_too_long_to_write_fails_without_retry(executor):
    executor.submit("contract.hook", None, task_id="bigint", retry_limit=3)
    HOOKS["bigint"] = lambda context: {"n": 10**5000}
    assert run_next(executor) is TaskStatus.FAILED
    info = executor.get_task("bigint")
    assert (info.attempts, info.result) == (1, None)
    assert info.last_error.startswith("result cannot be stored: $.n is an integer too long")


def test_a_result_nested_too_deeply_to_write_fails_without_retry(executor):
    executor.submit("contract.hook", None, task_id="deep", retry_limit=3)
    HOOKS["deep"] = lambda context: deep(100_000)
    assert run_next(executor) is TaskStatus.FAILED
    info = executor.get_task("deep")
    assert info.attempts == 1
    assert (
        info.last_error
        == "result cannot be stored: the value is nested too deeply to write as JSON"
    )


def test_the_writer_fails_a_refused_completion_alone_and_writes_the_others(
    executor, storage, alias
):
    """One completion the storage refuses (here a value it cannot encode, and on MariaDB a JSON
    document nested deeper than its 32 levels) fails that task alone; the batch it came in with
    is written, and later completions are not held up behind it."""
    ids = [executor.submit("demo.echo", {}, task_id=f"w-{i}").task_id for i in range(6)]
    started = {
        c.task_id: c for c in storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    }
    runner = TaskRunner(executor, LEASE)
    writer = runner.start_writer()
    values = {
        "w-0": encode("fine"),
        "w-1": 10**5000,  # not encoded by a worker: the storage's own encoding refuses it
        "w-2": encode({"n": 2}),
        "w-3": encode(deep(40)),  # more levels than MariaDB's JSON takes
        "w-4": encode([4]),
    }
    for task_id, value in values.items():
        writer.put(started[task_id], value)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(
        executor.get_task(i).status is TaskStatus.RUNNING for i in values
    ):
        time.sleep(0.05)
    writer.put(started["w-5"], encode("later"))  # not held up by what came before
    writer.close(timeout=10)
    status = {i: executor.get_task(i).status for i in ids}
    assert status["w-1"] is TaskStatus.FAILED
    assert executor.get_task("w-1").last_error.startswith("result cannot be stored: ")
    assert "integer" in executor.get_task("w-1").last_error
    refused_deep = alias == "mariadb"
    assert status["w-3"] is (TaskStatus.FAILED if refused_deep else TaskStatus.COMPLETED)
    if refused_deep:
        assert executor.get_task("w-3").last_error.startswith("result cannot be stored: ")
    else:
        assert executor.get_task("w-3").result == deep(40)
    for task_id in ("w-0", "w-2", "w-4", "w-5"):
        assert status[task_id] is TaskStatus.COMPLETED, task_id
    assert executor.get_task("w-2").result == {"n": 2}
    assert writer.held() == []


def test_large_parameters_and_results_are_split_across_statements(executor, storage):
    """40 parameters and results of about 1 MiB each (some mostly quotes, which the MySQL driver
    escapes): one statement of them all would overflow MariaDB's max_allowed_packet."""

    def big(i: int) -> dict:
        filler = '"' * (MIB // 3) if i % 2 else "x" * (MIB - 100)
        return {"i": i, "filler": filler}

    requests = [TaskSubmitRequest("demo.echo", big(i), task_id=f"big-{i:02d}") for i in range(40)]
    infos = executor.submit_many(requests)
    assert [info.task_id for info in infos] == [r.task_id for r in requests]
    assert executor.get_task("big-07").parameter == big(7)
    claims = []
    while len(claims) < 40:
        batch = storage.claim("w1", ["default"], 40, LEASE)
        assert batch, f"only {len(claims)} of 40 claimable"
        claims += batch
    started = storage.start_many(claims, LEASE)
    transitions = storage.complete_many([(claim, claim.task.parameter) for claim in started])
    assert all(t is not None and t.status is TaskStatus.COMPLETED for t in transitions)
    assert executor.count_by_status()[TaskStatus.COMPLETED] == 40
    assert executor.get_task("big-12").result == big(12)
    assert executor.get_task("big-13").result == big(13)


@pytest.mark.parametrize("alias", db_params(["mariadb"]))
def test_a_result_over_max_allowed_packet_fails_alone(executor, storage, alias):
    require(alias)
    ids = [executor.submit("contract.hook", None, task_id=f"p-{i}").task_id for i in range(2)]
    HOOKS["p-0"] = lambda context: "x" * (17 * MIB)  # the server takes 16 MiB per statement
    HOOKS["p-1"] = lambda context: "fine"
    claims = storage.claim("w1", ["default"], 10, LEASE)
    assert sorted(run_claims(executor, claims)) == [TaskStatus.COMPLETED, TaskStatus.FAILED]
    huge = executor.get_task(ids[0])
    assert huge.status is TaskStatus.FAILED
    assert huge.last_error.startswith("result cannot be stored: ")
    assert "max_allowed_packet" in huge.last_error
    assert executor.get_task(ids[1]).result == "fine"


@pytest.mark.parametrize("alias", db_params(["mariadb"]))
def test_a_parameter_over_max_allowed_packet_is_refused_at_submit(executor, alias):
    require(alias)
    requests = [
        TaskSubmitRequest("demo.echo", {"small": 1}, task_id="small"),
        TaskSubmitRequest("demo.echo", "x" * (17 * MIB), task_id="huge"),
    ]
    with (
        override_settings(RELIABLE_EXECUTOR={"MAX_PARAMETER_BYTES": 64 * MIB}),
        pytest.raises(ParameterTooLargeError, match="max_allowed_packet"),
    ):
        executor.submit_many(requests)
    assert executor.get_task("small") is None  # nothing stored
