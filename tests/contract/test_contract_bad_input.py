"""Contract: every bad submit raises a TaskSubmitError naming the field and stores nothing."""

from __future__ import annotations

import datetime as dt

import pytest
from demo.tasks import OrderParam

from django_reliable_executor import TaskStatus, TaskSubmitError, TaskSubmitRequest
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.core.options import MAX_MILLIS
from django_reliable_executor.exceptions import (
    InvalidParameterError,
    InvalidTaskIdError,
    InvalidTaskOptionError,
    ParameterTooLargeError,
    UnknownTaskError,
)
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.contract_support import assert_refused

UTC = dt.timezone.utc


def circular() -> list:
    loop: list = []
    loop.append(loop)
    return loop


class NotJson:
    pass


# -- parameters -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "parameter",
    [
        {1, 2},
        NotJson(),
        b"bytes",
        {1: "int key"},
        {"nested": {"deeper": [1, object()]}},
        float("nan"),
        float("inf"),
        {"a": [float("-inf")]},
        dt.datetime(2030, 1, 1, tzinfo=UTC),
        circular(),
        "nul\x00inside",  # PostgreSQL's jsonb cannot store it: refused on every storage alike
        {"key\x00": 1},
        "lone \ud800 surrogate",
        {"\udfff": 1},
    ],
    ids=[
        "set",
        "object",
        "bytes",
        "int-key",
        "nested",
        "nan",
        "inf",
        "nested-inf",
        "dt",
        "loop",
        "nul",
        "nul-key",
        "surrogate",
        "surrogate-key",
    ],
)
def test_non_json_parameter_is_refused(seeded, parameter):
    assert_refused(
        seeded,
        InvalidParameterError,
        "task_parameter",
        lambda: seeded.submit("demo.echo", parameter, task_id="bad"),
    )


def test_error_names_the_json_path_of_the_bad_value(seeded):
    error = assert_refused(
        seeded,
        InvalidParameterError,
        "task_parameter",
        lambda: seeded.submit("demo.echo", {"items": [1, {"price": float("nan")}]}),
    )
    assert "$.items[1].price" in str(error)


def test_oversized_parameter_is_refused(storage, clock):
    limited = ReliableExecutor(
        storage, clock=clock, settings=ExecutorSettings(MAX_PARAMETER_BYTES=64)
    )
    limited.submit("demo.echo", "x" * 62, task_id="fits")  # 64 bytes as JSON, quotes included
    error = assert_refused(
        limited,
        ParameterTooLargeError,
        "task_parameter",
        lambda: limited.submit("demo.echo", "x" * 63, task_id="too-big"),
    )
    assert "MAX_PARAMETER_BYTES" in str(error)
    # Bytes count, not characters: 40 two-byte characters are 82 bytes.
    assert_refused(
        limited,
        ParameterTooLargeError,
        "task_parameter",
        lambda: limited.submit("demo.echo", "é" * 40, task_id="wide"),
    )
    assert [t.task_id for t in limited.list_tasks()] == ["fits"]


def test_default_limit_is_one_mebibyte(seeded):
    assert_refused(
        seeded,
        ParameterTooLargeError,
        "task_parameter",
        lambda: seeded.submit("demo.echo", "x" * 1048576, task_id="huge"),
    )


@pytest.mark.parametrize(
    ("parameter", "named"),
    [
        ({"order_id": 1}, "amount"),
        ({"order_id": "1", "amount": 1.0}, "order_id"),
        ({"order_id": True, "amount": 1.0}, "order_id"),
        ({"order_id": 1, "amount": "lots"}, "amount"),
        ({"order_id": 1, "amount": 1.0, "coupon": "FREE"}, "coupon"),
        ([1, 2.0], "OrderParam"),
        ("order 1", "OrderParam"),
        (None, "OrderParam"),
    ],
    ids=[
        "missing",
        "str-for-int",
        "bool-for-int",
        "str-for-float",
        "unknown",
        "list",
        "str",
        "none",
    ],
)
def test_parameter_not_fitting_param_type_is_refused(seeded, parameter, named):
    error = assert_refused(
        seeded,
        InvalidParameterError,
        "task_parameter",
        lambda: seeded.submit("demo.process_order", parameter, task_id="order"),
    )
    assert named in str(error)


def test_fitting_param_type_is_accepted_as_dict_or_instance(seeded):
    seeded.submit("demo.process_order", {"order_id": 1, "amount": 2}, task_id="as-dict")
    seeded.submit("demo.process_order", OrderParam(2, 3.5, "USD"), task_id="as-instance")
    assert seeded.get_task("as-instance").parameter == {
        "order_id": 2,
        "amount": 3.5,
        "currency": "USD",
    }


def test_parameter_for_a_handler_without_one_is_refused(seeded):
    assert_refused(
        seeded,
        InvalidParameterError,
        "task_parameter",
        lambda: seeded.submit("demo.noop", {"unexpected": 1}, task_id="noop"),
    )
    assert seeded.submit("demo.noop", task_id="noop-ok").parameter is None


# -- task ids and names -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "task_id",
    [
        "",
        "x" * 192,
        "with space",
        "tab\there",
        "new\nline",
        " leading",
        "trailing\u00a0",  # no-break space
        "nul\x00",
        "del\x7f",
        "zero\u200bwidth",  # format character
        123,
        b"bytes-id",
        ["list"],
    ],
    ids=[
        "empty",
        "192-chars",
        "space",
        "tab",
        "newline",
        "leading",
        "nbsp",
        "nul",
        "del",
        "zero-width",
        "int",
        "bytes",
        "list",
    ],
)
def test_bad_task_id_is_refused(seeded, task_id):
    assert_refused(
        seeded,
        InvalidTaskIdError,
        "task_id",
        lambda: seeded.submit("demo.echo", None, task_id=task_id),
    )


def test_longest_and_unicode_task_ids_are_accepted(seeded):
    longest = "x" * 191
    assert seeded.submit("demo.echo", None, task_id=longest).task_id == longest
    assert seeded.get_task(longest) is not None
    assert seeded.submit("demo.echo", None, task_id="zahlung-über-€").task_id == "zahlung-über-€"
    assert seeded.get_task("zahlung-über-€") is not None


@pytest.mark.parametrize(
    "task_name",
    ["no.such.task", "", None, 42, "x" * 192],
    ids=["unknown", "empty", "none", "int", "too-long"],
)
def test_unknown_or_malformed_task_name_is_refused(seeded, task_name):
    assert_refused(
        seeded,
        UnknownTaskError,
        "task_name",
        lambda: seeded.submit_task(TaskSubmitRequest(task_name=task_name, task_id="named")),
    )


# -- options ----------------------------------------------------------------------------------
NAIVE = dt.datetime(2030, 1, 1, 12, 0)
AWARE = dt.datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"retry_limit": -1}, "retry_limit"),
        ({"retry_limit": "3"}, "retry_limit"),
        ({"retry_limit": True}, "retry_limit"),
        ({"retry_limit": 1.5}, "retry_limit"),
        ({"retry_interval": -100}, "retry_interval"),
        ({"retry_interval": 2.5}, "retry_interval"),
        ({"retry_backoff": "linear"}, "retry_backoff"),
        ({"retry_backoff": ""}, "retry_backoff"),
        ({"max_duration_millis": 0}, "max_duration_millis"),
        ({"max_duration_millis": -5}, "max_duration_millis"),
        ({"max_duration_millis": True}, "max_duration_millis"),
        ({"max_duration_millis": 1.5}, "max_duration_millis"),
        ({"queue": ""}, "queue"),
        ({"queue": "two words"}, "queue"),
        ({"queue": "a,b"}, "queue"),
        ({"queue": "q" * 101}, "queue"),
        ({"queue": 5}, "queue"),
        ({"priority": True}, "priority"),
        ({"priority": "high"}, "priority"),
        ({"priority": 1.0}, "priority"),
        ({"priority": 2**31}, "priority"),
        ({"priority": -(2**31) - 1}, "priority"),
        ({"delay_millis": -1}, "delay_millis"),
        ({"delay_millis": 1.5}, "delay_millis"),
        ({"run_at": NAIVE}, "run_at"),
        ({"run_at": "2030-01-01T12:00:00Z"}, "run_at"),
        ({"run_at": dt.date(2030, 1, 1)}, "run_at"),
        ({"run_at": AWARE, "delay_millis": 100}, "run_at"),
        ({"retries": 3}, "retries"),
        # Too big to store or to schedule: refused up front, never a database error later.
        ({"retry_limit": 2**31}, "retry_limit"),
        ({"retry_interval": MAX_MILLIS + 1}, "retry_interval"),
        ({"retry_interval": 2**61}, "retry_interval"),
        ({"max_duration_millis": MAX_MILLIS + 1}, "max_duration_millis"),
        ({"delay_millis": MAX_MILLIS + 1}, "delay_millis"),
        ({"delay_millis": 10**18}, "delay_millis"),
        ({"run_at": dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=5)))}, "run_at"),
    ],
    ids=lambda value: (
        "-".join(f"{k}={v!r}"[:30] for k, v in value.items()) if isinstance(value, dict) else None
    ),
)
def test_bad_option_is_refused(seeded, options, field):
    assert_refused(
        seeded,
        InvalidTaskOptionError,
        field,
        lambda: seeded.submit("demo.echo", None, task_id="opt", **options),
    )


def test_boundary_options_are_accepted(seeded, clock):
    info = seeded.submit(
        "demo.echo",
        None,
        task_id="edge",
        retry_limit=0,
        retry_interval=0,
        max_duration_millis=1,
        queue="q" * 100,
        priority=2**31 - 1,
        run_at=clock.now() - dt.timedelta(days=1),  # in the past: due now
    )
    assert info.run_at == clock.now()
    assert seeded.submit("demo.echo", None, task_id="low", priority=-(2**31)).priority == -(2**31)


def test_largest_options_are_stored_and_scheduled(seeded, storage, clock):
    seeded.submit(
        "demo.echo",
        None,
        task_id="max",
        retry_limit=2**31 - 1,
        retry_interval=MAX_MILLIS,
        max_duration_millis=MAX_MILLIS,
    )
    seeded.submit("demo.echo", None, task_id="far", delay_millis=MAX_MILLIS)
    seeded.submit("demo.echo", None, task_id="end", run_at=dt.datetime.max.replace(tzinfo=UTC))
    stored = seeded.get_task("max")
    assert (stored.retry_limit, stored.retry_interval) == (2**31 - 1, MAX_MILLIS)
    assert seeded.get_task("far").run_at == clock.now() + dt.timedelta(milliseconds=MAX_MILLIS)
    assert seeded.get_task("end").run_at.year == 9999
    [claim] = storage.claim("w", ["default"], 10, 60)
    started = storage.start(claim, 60)
    # The longest retry interval still gives a valid next run time.
    assert storage.fail(started, "boom", retryable=True).status is TaskStatus.PENDING
    assert seeded.get_task("max").run_at == clock.now() + dt.timedelta(milliseconds=MAX_MILLIS)


# -- batches ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "error", "field"),
    [
        (
            TaskSubmitRequest("demo.echo", {1, 2}, task_id="b-bad"),
            InvalidParameterError,
            "task_parameter",
        ),
        (TaskSubmitRequest("demo.echo", None, task_id="b c"), InvalidTaskIdError, "task_id"),
        (TaskSubmitRequest("nope", None, task_id="b-bad"), UnknownTaskError, "task_name"),
        (TaskSubmitRequest("demo.echo", None, priority=True), InvalidTaskOptionError, "priority"),
    ],
    ids=["parameter", "id", "name", "option"],
)
def test_submit_many_with_one_bad_request_stores_none(seeded, bad, error, field):
    good = [TaskSubmitRequest("demo.echo", i, task_id=f"b-{i}") for i in range(3)]
    assert_refused(seeded, error, field, lambda: seeded.submit_many([*good, bad, *good]))
    assert seeded.get_task("b-0") is None


def test_submit_many_refuses_what_is_not_a_request(seeded):
    tasks_before = seeded.list_tasks()
    with pytest.raises(TaskSubmitError, match="TaskSubmitRequest"):
        seeded.submit_many([TaskSubmitRequest("demo.echo", task_id="ok"), {"task_name": "x"}])
    assert seeded.list_tasks() == tasks_before


def test_refusals_leave_the_executor_working(seeded, storage):
    for task_id in ("", "a b", None):
        with pytest.raises(TaskSubmitError):
            seeded.submit("demo.echo", {1}, task_id=task_id)
    info = seeded.submit("demo.echo", "fine", task_id="after")
    assert info.status is TaskStatus.CREATED
    assert {c.task_id for c in storage.claim("w", ["default", "q"], 10, 60)} == {
        "existing",
        "after",
    }
