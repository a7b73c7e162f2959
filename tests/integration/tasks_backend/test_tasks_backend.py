"""Conformance of ReliableExecutorBackend to Django's Tasks contract (django.tasks on Django 6, the
django-tasks backport on 5.2), in process, on every storage: enqueueing, results, validation,
run_after, priority, signals, and how stored statuses read as Django's."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import traceback
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps as django_apps
from djtasks import tasks as djtasks
from djtasks.tasks import CustomError

from django_reliable_executor.conf import get_settings
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.registry import get_handler, unregister
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.tasks_backend import ReliableExecutorBackend, exception_path
from django_reliable_executor.tasks_compat import (
    DECORATOR_OPTIONS,
    SOURCE,
    InvalidTaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.conftest import TASK_APPS
from tests.support.contract_support import LEASE, claim_and_start, connected, run_next

if SOURCE == "django.tasks":
    from django.tasks import task
    from django.tasks.exceptions import TaskResultMismatch
else:
    from django_tasks import task
    from django_tasks.exceptions import TaskResultMismatch


def _bounded() -> None:
    """A task with a deadline, so its stored task can time out."""


# Built from the backend's task class rather than with @task(max_duration_millis=...), which
# Django 6.0's decorator does not accept (test_task_options_in_the_decorator covers that).
bounded = task_backends["default"].task_class(
    func=_bounded,
    priority=0,
    backend="default",
    queue_name="default",
    run_after=None,
    takes_context=False,
    max_duration_millis=500,
)


def takes_no_context(value: int) -> int:
    """Module level, but without the ``context`` first argument takes_context requires."""
    return value


@pytest.fixture
def backend(storage, clock, monkeypatch) -> ReliableExecutorBackend:
    """The configured backend, submitting through the module executor pointed at the storage
    (and fake clock) under test."""
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    monkeypatch.setattr(module_executor, "_storage", storage)
    monkeypatch.setattr(module_executor, "_clock", clock)
    return task_backends["default"]


def stored_count(storage) -> int:
    return sum(storage.count().values())


def a_traceback(exc: BaseException) -> str:
    """The text of a real traceback of ``exc``, raised and caught here."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - any exception, as a worker records it
        return "".join(traceback.format_exception(caught))


# -- the backend ------------------------------------------------------------------------------
def test_configured_backend_and_its_features():
    backend = task_backends["default"]
    assert isinstance(backend, ReliableExecutorBackend)
    assert backend.alias == "default"
    assert backend.options == {"retry_limit": 0}
    assert set(backend.queues) == {"default", "djtasks"}
    assert backend.supports_defer is True
    assert backend.supports_priority is True
    assert backend.supports_get_result is True
    assert backend.supports_async_task is True
    assert djtasks.echo.get_backend() is backend
    assert isinstance(djtasks.echo, backend.task_class)


def test_check_is_clean_for_the_configured_backend():
    assert list(task_backends["default"].check()) == []
    good = ReliableExecutorBackend(
        "x",
        {
            "OPTIONS": {
                "retry_limit": 3,
                "retry_interval": 100,
                "retry_backoff": "exponential",
                "max_duration_millis": 60_000,
                "retry_on": ["builtins.ConnectionError", "djtasks.tasks.CustomError"],
            }
        },
    )
    assert list(good.check()) == []
    assert good.defaults["retry_on"] == (ConnectionError, CustomError)
    # A built-in exception by its bare name too.
    bare = ReliableExecutorBackend("x", {"OPTIONS": {"retry_on": ["ConnectionError"]}})
    assert list(bare.check()) == []
    assert bare.defaults["retry_on"] == (ConnectionError,)


def test_a_bare_name_that_is_no_builtin_says_to_give_a_dotted_path():
    [error] = ReliableExecutorBackend("x", {"OPTIONS": {"retry_on": "NoSuchError"}}).check()
    assert "'NoSuchError' is neither a built-in exception nor a dotted path" in error.msg


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"no_such_option": 1}, "no_such_option"),
        ({"retry_limit": -1}, "retry_limit"),
        ({"retry_limit": "3"}, "retry_limit"),
        ({"retry_limit": True}, "retry_limit"),
        ({"retry_interval": 1.5}, "retry_interval"),
        ({"max_duration_millis": -5}, "max_duration_millis"),
        ({"attempt_timeout": 0}, "attempt_timeout"),
        ({"attempt_timeout": "30"}, "attempt_timeout"),
        ({"attempt_timeout": dt.timedelta(seconds=-1)}, "attempt_timeout"),
        ({"retry_backoff": "sideways"}, "retry_backoff"),
        ({"retry_on": "no_such_module.NoSuchError"}, "retry_on"),
        ({"retry_on": "os.path"}, "retry_on"),
        ({"retry_on": ["builtins.ValueError", "builtins.len"]}, "retry_on"),
    ],
)
def test_check_names_the_bad_option(options, key):
    bad = ReliableExecutorBackend("x", {"OPTIONS": options})
    errors = list(bad.check())
    assert len(errors) == 1, errors
    assert errors[0].id == "django_reliable_executor.E020"
    assert "TASKS['x']['OPTIONS']" in errors[0].msg
    assert key in errors[0].msg
    # A backend with bad OPTIONS enqueues nothing.
    with pytest.raises(InvalidTaskError, match=key):
        bad.enqueue(djtasks.meaning_of_life.using(backend="default"), (), {})


def test_per_task_options_are_validated():
    with pytest.raises(InvalidTaskError, match="retry_limit"):
        dataclasses.replace(djtasks.meaning_of_life, retry_limit=-1)
    with pytest.raises(InvalidTaskError, match="retry_backoff"):
        dataclasses.replace(djtasks.meaning_of_life, retry_backoff="sideways")
    with pytest.raises(InvalidTaskError, match="retry_on"):
        dataclasses.replace(djtasks.meaning_of_life, retry_on=("builtins.len",))
    with pytest.raises(InvalidTaskError, match="attempt_timeout must be"):
        dataclasses.replace(djtasks.meaning_of_life, attempt_timeout=0)


def test_attempt_timeout_from_options_or_the_task_and_durations_as_timedeltas(backend):
    """OPTIONS and a task's own options take seconds or a timedelta for attempt_timeout (and a
    timedelta for the millisecond durations); the task's own comes first."""
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    options = {"attempt_timeout": dt.timedelta(seconds=2.5), "retry_interval": dt.timedelta(0, 1)}
    configured = ReliableExecutorBackend("x", {"OPTIONS": options})
    assert list(configured.check()) == []
    result = configured.enqueue(djtasks.meaning_of_life.using(backend="default"), (), {})
    info = module_executor.get_task(result.id)
    assert (info.attempt_timeout, info.retry_interval) == (2.5, 1000)
    own = dataclasses.replace(djtasks.meaning_of_life, attempt_timeout=dt.timedelta(seconds=0.5))
    info = module_executor.get_task(configured.enqueue(own, (), {}).id)
    assert info.attempt_timeout == 0.5


# -- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("priority", [-101, 101, 1000, -1000])
def test_priority_out_of_range_is_invalid(priority):
    with pytest.raises(InvalidTaskError):
        djtasks.meaning_of_life.using(priority=priority).enqueue()


@pytest.mark.parametrize("priority", [-100, 100])
def test_priority_bounds_are_valid(priority):
    assert djtasks.meaning_of_life.using(priority=priority).priority == priority


def test_unknown_queue_is_invalid():
    with pytest.raises(InvalidTaskError):
        djtasks.meaning_of_life.using(queue_name="no-such-queue").enqueue()


def test_naive_run_after_is_invalid():
    with pytest.raises(InvalidTaskError):
        djtasks.meaning_of_life.using(run_after=dt.datetime(2030, 1, 1)).enqueue()


def test_takes_context_without_context_argument_is_invalid():
    with pytest.raises(InvalidTaskError):
        task(takes_context=True)(takes_no_context)


def test_a_function_not_at_module_level_is_invalid():
    def inner() -> None:
        return None

    with pytest.raises(InvalidTaskError):
        task()(inner)
    with pytest.raises(InvalidTaskError):
        task()(lambda: None)


def test_a_task_is_named_by_its_module_path():
    assert djtasks.echo.module_path == "djtasks.tasks.echo"
    assert djtasks.echo.name == "echo"


# -- enqueue and get_result ---------------------------------------------------------------------
def test_enqueue_returns_a_ready_result(backend, storage, clock):
    result = djtasks.echo.enqueue(1, (2, (3, 4)), "x", key=("a", ["b", ("c",)]), none=None)
    assert isinstance(result, TaskResult)
    assert isinstance(result.id, str) and result.id
    assert result.status == TaskResultStatus.READY
    assert result.task == djtasks.echo
    assert result.backend == "default"
    assert result.args == [1, [2, [3, 4]], "x"]
    assert result.kwargs == {"key": ["a", ["b", ["c"]]], "none": None}
    assert result.enqueued_at == clock.now()
    assert result.enqueued_at.tzinfo is not None
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    assert result.attempts == 0
    assert result.worker_ids == []
    assert result.errors == []
    assert result.is_finished is False
    with pytest.raises(ValueError):
        _ = result.return_value


def test_enqueue_stores_a_task_of_this_app(backend, storage):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    result = djtasks.echo.using(priority=7).enqueue(1, two=2)
    info = module_executor.get_task(result.id)
    assert info is not None
    assert info.task_name == "djtasks.tasks.echo"
    assert info.queue == "default"
    assert info.priority == 7
    assert info.status is TaskStatus.CREATED
    assert info.parameter == {"args": [1], "kwargs": {"two": 2}}
    assert info.retry_limit == 0  # the backend's OPTIONS

    own = djtasks.on_own_queue.enqueue()
    info = module_executor.get_task(own.id)
    assert (info.task_name, info.queue, info.priority) == (
        "djtasks.tasks.on_own_queue",
        "djtasks",
        5,
    )

    flaky = djtasks.flaky.enqueue(fail_times=1)
    info = module_executor.get_task(flaky.id)
    assert (info.retry_limit, info.retry_interval) == (2, 0)  # its backend alias's OPTIONS


def test_get_result_equals_the_enqueued_result(backend, clock):
    clock.advance(0.123457)  # times with microseconds read back the same
    for enqueued in (
        djtasks.echo.enqueue(1, (2,), k="v"),
        djtasks.meaning_of_life.using(priority=-3).enqueue(),
        djtasks.on_own_queue.enqueue(),
        djtasks.add_async.enqueue(1, 2),
        djtasks.context_info.enqueue(),
    ):
        got = backend.get_result(enqueued.id)
        assert got == enqueued
        assert got.task.func is enqueued.task.func
        assert type(enqueued.task).get_result(enqueued.task, enqueued.id) == enqueued
        # refresh() keeps a READY result as it was.
        enqueued.refresh()
        assert enqueued.status == TaskResultStatus.READY


def test_async_enqueue_and_get_result(backend):
    result = async_to_sync(djtasks.add_async.aenqueue)(2, b=3)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert async_to_sync(backend.aget_result)(result.id) == result
    assert async_to_sync(djtasks.add_async.aget_result)(result.id) == result
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.READY


def test_unknown_result_id_does_not_exist(backend):
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result("no-such-id")
    with pytest.raises(TaskResultDoesNotExist):
        djtasks.echo.get_result("no-such-id")
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(backend.aget_result)("no-such-id")


def test_a_task_not_enqueued_by_django_does_not_exist_as_a_result(backend):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    plain = module_executor.submit("demo.echo", {"args": [], "kwargs": {}}, task_id="plain-1")
    other = module_executor.submit("demo.echo", {"n": 1}, task_id="plain-2")
    for task_id in (plain.task_id, other.task_id):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(task_id)
    # The name of a Django task, but not the parameter it enqueues with.
    odd = module_executor.submit("djtasks.tasks.echo", {"n": 1}, task_id="plain-3")
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(odd.task_id)


def test_get_result_of_another_tasks_id_is_a_mismatch(backend):
    result = djtasks.echo.enqueue()
    with pytest.raises(TaskResultMismatch):
        djtasks.meaning_of_life.get_result(result.id)
    with pytest.raises(TaskResultMismatch):
        async_to_sync(djtasks.meaning_of_life.aget_result)(result.id)


def test_arguments_json_cannot_hold_raise_and_store_nothing(backend, storage):
    # A TypeError, as Django's own backends raise, naming the task and where the value is.
    with pytest.raises(TypeError, match=r"djtasks.tasks.echo: args\[0\] is a datetime, which is"):
        djtasks.echo.enqueue(dt.datetime.now())
    with pytest.raises(TypeError, match=r"kwargs.when is an object, which is not JSON"):
        djtasks.echo.enqueue(when=object())
    with pytest.raises(TypeError, match=r"args\[0\]\[1\] is a set"):
        djtasks.echo.enqueue([1, {2, 3}])
    assert stored_count(storage) == 0


# -- run_after and priority ---------------------------------------------------------------------
def test_run_after_defers_the_task(backend, storage, clock):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    later = clock.now() + dt.timedelta(hours=1, microseconds=500)
    result = djtasks.meaning_of_life.using(run_after=later).enqueue()
    assert result.task.run_after == later
    assert module_executor.get_task(result.id).run_at == later
    got = backend.get_result(result.id)
    assert got.task.run_after == later
    assert got.status == TaskResultStatus.READY
    storage.promote_due(100)
    assert storage.claim("w1", ["default"], 10, LEASE) == []
    clock.advance(3601)
    storage.promote_due(100)
    assert [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)] == [result.id]


def test_run_after_in_another_time_zone_is_the_same_instant(backend, clock):
    zone = dt.timezone(dt.timedelta(hours=-5))
    later = (clock.now() + dt.timedelta(minutes=5)).astimezone(zone)
    result = djtasks.meaning_of_life.using(run_after=later).enqueue()
    assert backend.get_result(result.id).task.run_after == later


def test_higher_priority_is_claimed_first(backend, storage, clock):
    ids = {}
    for priority in (0, 10, -5, 100, -100, 10):
        ids.setdefault(priority, []).append(
            djtasks.meaning_of_life.using(priority=priority).enqueue().id
        )
        clock.advance(1)
    claimed = [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)]
    expected = [*ids[100], *ids[10], *ids[0], *ids[-5], *ids[-100]]
    assert claimed == expected


def test_queues_are_apart(backend, storage):
    own = djtasks.on_own_queue.enqueue()
    default = djtasks.meaning_of_life.enqueue()
    assert [c.task_id for c in storage.claim("w1", ["djtasks"], 10, LEASE)] == [own.id]
    assert [c.task_id for c in storage.claim("w1", ["default"], 10, LEASE)] == [default.id]


# -- signals --------------------------------------------------------------------------------------
def test_task_enqueued_is_sent_once_with_the_result(backend):
    calls: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        calls.append({"sender": sender, **kwargs})

    with connected(task_enqueued, receiver):
        result = djtasks.echo.enqueue(1)
    assert len(calls) == 1
    assert calls[0]["sender"] is ReliableExecutorBackend
    assert calls[0]["task_result"] == result


def test_no_task_enqueued_for_an_invalid_enqueue(backend):
    calls: list[Any] = []
    with (
        connected(task_enqueued, lambda sender, **kwargs: calls.append(kwargs)),
        pytest.raises(TypeError),
    ):
        djtasks.echo.enqueue(object())
    assert calls == []


# -- statuses: stored -> Django's ----------------------------------------------------------------
def test_running(backend, storage):
    result = djtasks.echo.enqueue(1)
    claim_and_start(storage, worker="w1")
    got = backend.get_result(result.id)
    assert got.status == TaskResultStatus.RUNNING
    assert got.started_at is not None and got.last_attempted_at == got.started_at
    assert got.finished_at is None
    assert got.worker_ids == ["w1"]
    assert got.attempts == 1
    assert got.errors == []
    assert got.is_finished is False
    with pytest.raises(ValueError):
        _ = got.return_value


def test_completed_is_successful(backend, storage, clock):
    result = djtasks.echo.enqueue(1)
    claim = claim_and_start(storage, worker="w1")
    clock.advance(2)
    assert storage.complete(claim, {"args": [1], "kwargs": {}}) is not None
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"args": [1], "kwargs": {}}
    assert result.is_finished is True
    assert result.finished_at == clock.now()
    assert result.started_at == clock.now() - dt.timedelta(seconds=2)
    assert result.errors == []
    assert result.worker_ids == ["w1"]


def test_completed_with_none_returns_none(backend, storage):
    result = djtasks.noop.enqueue()
    assert storage.complete(claim_and_start(storage), None) is not None
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value is None


@pytest.mark.parametrize(
    ("exc", "expected_class"),
    [
        (ValueError("message"), ValueError),
        (ValueError(), ValueError),
        (KeyError("k"), KeyError),
        (ValueError("two\nlines"), ValueError),
        (CustomError("custom failure"), CustomError),
    ],
)
def test_failed_is_failed_with_the_error(backend, storage, exc, expected_class):
    result = djtasks.fails.enqueue()
    text = a_traceback(exc)
    done = storage.fail(claim_and_start(storage), text, retryable=False)
    assert done is not None and done.status is TaskStatus.FAILED
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished is True
    assert result.finished_at is not None
    with pytest.raises(ValueError):
        _ = result.return_value
    assert len(result.errors) == 1
    error = result.errors[0]
    assert error.exception_class is expected_class
    assert error.traceback == text
    assert error.traceback.startswith("Traceback (most recent call last):")
    last = text.rstrip("\n").splitlines()[-1]
    assert error.traceback.endswith(last + "\n")
    assert result.worker_ids == ["w1"] and result.attempts == 1


def test_chained_exception_reads_as_the_last(backend, storage):
    try:
        try:
            raise KeyError("first")
        except KeyError as first:
            raise CustomError("second") from first
    except CustomError as caught:
        text = "".join(traceback.format_exception(caught))
    result = djtasks.fails_custom.enqueue()
    storage.fail(claim_and_start(storage), text, retryable=False)
    result.refresh()
    assert result.errors[0].exception_class is CustomError


def test_error_is_failed(backend, storage):
    result = djtasks.fails.enqueue()
    text = a_traceback(RuntimeError("handler missing"))
    done = storage.fail(claim_and_start(storage), text, retryable=False, is_error=True)
    assert done is not None and done.status is TaskStatus.ERROR
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [RuntimeError]
    with pytest.raises(ValueError):
        _ = result.return_value


def test_timeout_is_failed(backend, storage, clock):
    result = bounded.enqueue()
    clock.advance(1)
    assert [t.status for t in storage.expire_overdue(10)] == [TaskStatus.TIMEOUT]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished is True
    with pytest.raises(ValueError):
        _ = result.return_value
    for error in result.errors:
        assert issubclass(error.exception_class, BaseException)


def test_timeout_while_running_is_failed(backend, storage, clock):
    result = bounded.enqueue()
    claim_and_start(storage)
    clock.advance(1)
    assert [t.status for t in storage.expire_overdue(10)] == [TaskStatus.TIMEOUT]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    for error in result.errors:
        assert issubclass(error.exception_class, BaseException)


def test_cancelled_is_failed(backend):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    result = djtasks.echo.enqueue()
    assert module_executor.cancel_task(result.id)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished is True
    assert result.attempts == 0
    with pytest.raises(ValueError):
        _ = result.return_value
    for error in result.errors:
        assert issubclass(error.exception_class, BaseException)


def test_a_retry_waiting_is_ready_again(backend, storage, clock):
    result = djtasks.flaky.enqueue(fail_times=1)
    text = a_traceback(ConnectionError("attempt 1 failed"))
    done = storage.fail(claim_and_start(storage), text, retryable=True)
    assert done is not None and done.status is TaskStatus.PENDING
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.finished_at is None
    assert [e.exception_class for e in result.errors] == [ConnectionError]
    clock.advance(1)
    storage.promote_due(100)
    claim = claim_and_start(storage, worker="w2")
    assert storage.complete(claim, 2) is not None
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2
    assert result.attempts == 2 and len(result.worker_ids) == 2
    assert result.worker_ids[-1] == "w2"
    assert result.errors == [] or result.errors[0].exception_class is ConnectionError


@pytest.mark.parametrize(
    ("text", "path"),
    [
        (
            'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\n'
            "ValueError: message\n",
            "builtins.ValueError",
        ),
        (
            'Traceback (most recent call last):\n  File "x.py", line 1, in f\n    g()\n'
            "djtasks.tasks.CustomError: bad: worse\n",
            "djtasks.tasks.CustomError",
        ),
        ("worker lost", "builtins.RuntimeError"),
    ],
)
def test_exception_path_of_a_stored_traceback(text, path):
    assert exception_path(text) == path


# -- running in process -------------------------------------------------------------------------
def test_a_worker_runs_a_django_task_and_sends_djangos_signals(backend, storage):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    sent: list[tuple[str, Any]] = []

    def on_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(("started", task_result))

    def on_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(("finished", task_result))

    result = djtasks.echo.enqueue(1, (2,), k="v")
    with connected(task_started, on_started), connected(task_finished, on_finished):
        assert run_next(module_executor) is TaskStatus.COMPLETED
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"args": [1, [2]], "kwargs": {"k": "v"}}
    assert [(kind, r.id) for kind, r in sent] == [("started", result.id), ("finished", result.id)]
    assert sent[0][1].status == TaskResultStatus.RUNNING
    assert sent[1][1].status == TaskResultStatus.SUCCESSFUL


def test_a_worker_runs_an_async_task(backend, storage):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    result = djtasks.add_async.enqueue(20, b=22)
    assert run_next(module_executor) is TaskStatus.COMPLETED
    result.refresh()
    assert result.return_value == 42


def test_a_failing_task_records_its_exception(backend, storage):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    sent: list[Any] = []
    result = djtasks.fails_custom.enqueue()
    with connected(task_finished, lambda sender, task_result, **kw: sent.append(task_result)):
        assert run_next(module_executor) is TaskStatus.FAILED
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is CustomError
    assert result.errors[0].traceback.endswith("djtasks.tasks.CustomError: custom failure\n")
    assert [r.status for r in sent] == [TaskResultStatus.FAILED]


@pytest.mark.parametrize(
    ("option", "changed"),
    [({"queue": "other-queue"}, "queue_name"), ({"priority": 500}, "priority")],
)
def test_a_stored_django_task_these_settings_would_not_allow_still_reads(backend, option, changed):
    """A Django task's stored queue or priority that this process's TASKS would reject (another
    process's settings, a plain submit under the task's name) still reads as it was stored."""
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    info = module_executor.submit("djtasks.tasks.echo", {"args": [1], "kwargs": {}}, **option)
    result = backend.get_result(info.task_id)
    assert result.status == TaskResultStatus.READY
    assert result.args == [1]
    assert getattr(result.task, changed) == next(iter(option.values()))


def test_task_options_in_the_decorator(backend):
    """Django 6.1+ and the backport pass @task's extra keywords to the backend's task class
    (this app's options, stored with the task); Django 6.0's @task refuses them."""
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    if not DECORATOR_OPTIONS:
        with pytest.raises(TypeError):
            task(retry_limit=5)(takes_no_context)
        return
    result = djtasks.with_options.enqueue()
    info = module_executor.get_task(result.id)
    assert (info.retry_limit, info.retry_interval, info.retry_backoff) == (5, 1000, "exponential")
    assert info.max_duration_millis == 60_000
    assert info.attempt_timeout == 30.0
    handler = get_handler("djtasks.tasks.with_options")
    assert handler.retry_on == (ConnectionError, TimeoutError)
    assert handler.attempt_timeout == 30.0
    assert djtasks.with_options.get_result(result.id) == result


# -- task names read from the storage import only installed apps' modules ----------------------
@pytest.fixture
def forget_modules():
    """Each run starts with the by-name modules unimported and their tasks unregistered, and
    sees every installed app, as a worker does (the test database limits them to TASK_APPS)."""
    names = {
        "djtasks.imported_by_name": "djtasks.imported_by_name.triple",
        "testproject.outside_apps": "testproject.outside_apps.squat",
    }

    def forget() -> None:
        for module, task_name in names.items():
            sys.modules.pop(module, None)
            unregister(task_name)

    forget()
    django_apps.unset_available_apps()
    try:
        yield
    finally:
        django_apps.set_available_apps(TASK_APPS)
        forget()


def submit_by_name(storage, clock, task_name: str, parameter: Any) -> str:
    """Store a task under any name, as a process with ALLOW_UNKNOWN_TASKS (or the API) can."""
    settings = dataclasses.replace(get_settings(), ALLOW_UNKNOWN_TASKS=True)
    return (
        ReliableExecutor(storage, clock=clock, settings=settings)
        .submit(task_name, parameter)
        .task_id
    )


@pytest.mark.usefixtures("forget_modules")
def test_a_task_of_an_installed_app_module_nobody_imported_runs(backend, storage, clock):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    task_id = submit_by_name(
        storage, clock, "djtasks.imported_by_name.triple", {"args": [14], "kwargs": {}}
    )
    assert "djtasks.imported_by_name" not in sys.modules
    assert run_next(module_executor) is TaskStatus.COMPLETED
    assert storage.get(task_id).result == 42
    assert "djtasks.imported_by_name" in sys.modules


@pytest.mark.usefixtures("forget_modules")
@pytest.mark.parametrize(
    "task_name", ["testproject.outside_apps.squat", "subprocess.run", "os.system"]
)
def test_a_task_name_outside_installed_apps_is_not_imported(backend, storage, clock, task_name):
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    module = task_name.rpartition(".")[0]
    was_imported = module in sys.modules  # os and subprocess are, by Python or Django
    task_id = submit_by_name(storage, clock, task_name, {"args": [["true"]], "kwargs": {}})
    assert run_next(module_executor) is TaskStatus.ERROR
    info = storage.get(task_id)
    assert info.status is TaskStatus.ERROR
    assert f"no handler is registered for task name {task_name!r}" in info.last_error
    assert (module in sys.modules) == was_imported


def test_exception_path_imports_no_module_outside_installed_apps():
    sys.modules.pop("testproject.outside_apps", None)
    text = 'Traceback (most recent call last):\n  File "x.py", line 1\n    g()\n'
    text += "testproject.outside_apps.Boom: x\n"
    assert exception_path(text) == "builtins.RuntimeError"
    assert "testproject.outside_apps" not in sys.modules


def test_a_django_task_reports_progress_read_back_on_its_result(backend, storage, clock):
    """This backend's TaskContext has set_progress; its TaskResult a ``progress`` attribute
    (Django's has no field for it), read again by refresh()."""
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    result = djtasks.report_progress.enqueue(2, 4)
    assert result.progress is None
    assert run_next(module_executor) is TaskStatus.COMPLETED
    result.refresh()
    assert result.progress == {
        "current": 2,
        "total": 4,
        "message": "from a Django task",
        "updated_at": clock.now(),
    }
    assert backend.get_result(result.id).progress == result.progress


def test_a_django_task_uses_durable_steps_and_waits_through_its_context(backend, storage):
    """This backend's TaskContext has step and the waits: the task waits for its event (READY:
    PENDING), then resumes and returns, its step run once."""
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    result = djtasks.approve_then_charge.enqueue(7)
    assert run_next(module_executor) is TaskStatus.PENDING
    task = module_executor.get_task(result.id)
    assert task.waiting["event"] == "approval" and [s.name for s in task.steps] == [
        "charge",
        "approval",
    ]
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert module_executor.send_event(result.id, "approval", {"by": "ann"})
    assert run_next(module_executor) is TaskStatus.COMPLETED
    result.refresh()
    assert result.return_value == {"charged": "charged 7", "approval": {"by": "ann"}}
