"""One rule per task option: a bad value gets the same error (type, field and message) wherever
it enters (submit, submit_task, submit_many, schedule, schedule_many, the decorator and its
declared schedules, the Django Tasks backend, the HTTP API), and nothing is stored."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_reliable_executor import tasks_compat
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.core.options import MAX_MILLIS, RETRY_NAMES, TaskOptions
from django_reliable_executor.core.records import TaskSubmitRequest
from django_reliable_executor.exceptions import (
    HandlerRegistrationError,
    InvalidTaskOptionError,
    TaskSubmitError,
)
from django_reliable_executor.registry import get_handler, reliable_task_handler, unregister
from django_reliable_executor.schedules.records import Schedule
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import admin_params

BAD: list[tuple[str, Any]] = [
    ("retry_limit", -1),
    ("retry_limit", 2**31),
    ("retry_limit", True),
    ("retry_limit", 1.5),
    ("retry_limit", "3"),
    ("retry_interval", -1),
    ("retry_interval", MAX_MILLIS + 1),
    ("retry_interval", 0.5),
    ("retry_backoff", "linear"),
    ("retry_backoff", 3),
    ("max_duration_millis", 0),
    ("max_duration_millis", -5),
    ("max_duration_millis", MAX_MILLIS + 1),
    ("max_duration_millis", True),
    ("queue", ""),
    ("queue", "two words"),
    ("queue", "a,b"),
    ("queue", "q" * 101),
    ("queue", 5),
    ("priority", 2**31),
    ("priority", -(2**31) - 1),
    ("priority", True),
    ("priority", "high"),
    ("priority", 1.5),
]
BAD_IDS = [f"{name}={value!r}"[:40] for name, value in BAD]
TASK = "demo.echo"


def reference(name: str, value: Any) -> TaskSubmitError:
    """What ``executor.submit`` raises for this value: the error every entry point must give.
    Refused before the storage is touched, so no storage is needed."""
    with pytest.raises(TaskSubmitError) as raised:
        ReliableExecutor(clock=FakeClock()).submit(TASK, None, **{name: value})
    return raised.value


def assert_same(error: BaseException, expected: TaskSubmitError) -> None:
    assert type(error) is type(expected)
    assert isinstance(error, TaskSubmitError)
    assert (error.field, str(error)) == (expected.field, str(expected))


@pytest.mark.parametrize(("name", "value"), BAD, ids=BAD_IDS)
def test_submit_gives_an_invalid_task_option_error_naming_the_option(name, value):
    expected = reference(name, value)
    assert type(expected) is InvalidTaskOptionError
    assert expected.field == name
    assert str(expected).startswith(f"{name} must be ")
    assert repr(value)[:20] in str(expected)


# -- the service: submit, submit_task, submit_many, schedule, schedule_many -----------------------
def _submit(executor: ReliableExecutor, name: str, value: Any) -> None:
    executor.submit(TASK, None, **{name: value})


def _submit_task(executor: ReliableExecutor, name: str, value: Any) -> None:
    executor.submit_task(TaskSubmitRequest(TASK, **{name: value}))


def _submit_many(executor: ReliableExecutor, name: str, value: Any) -> None:
    executor.submit_many(
        [TaskSubmitRequest(TASK, task_id="good"), TaskSubmitRequest(TASK, **{name: value})]
    )


def _schedule(executor: ReliableExecutor, name: str, value: Any) -> None:
    executor.schedule("options.sched", TASK, every=60, **{name: value})


def _schedule_many(executor: ReliableExecutor, name: str, value: Any) -> None:
    executor.schedule_many(
        [
            Schedule(every=60, schedule_id="options.good", task_name=TASK),
            Schedule(every=60, schedule_id="options.sched", task_name=TASK, **{name: value}),
        ]
    )


SERVICE_ENTRIES: dict[str, Callable[[ReliableExecutor, str, Any], None]] = {
    "submit": _submit,
    "submit_task": _submit_task,
    "submit_many": _submit_many,
    "schedule": _schedule,
    "schedule_many": _schedule_many,
}


@pytest.mark.parametrize("entry", list(SERVICE_ENTRIES))
@pytest.mark.parametrize(("name", "value"), BAD, ids=BAD_IDS)
def test_the_service_entry_points_give_submits_error_and_store_nothing(
    executor, entry, name, value
):
    expected = reference(name, value)
    with pytest.raises(TaskSubmitError) as raised:
        SERVICE_ENTRIES[entry](executor, name, value)
    assert_same(raised.value, expected)
    assert executor.list_tasks() == []
    assert executor.list_schedules() == []


# -- the decorator ------------------------------------------------------------------------------
@pytest.fixture
def handler_name() -> Iterator[str]:
    yield "options.bad"
    unregister("options.bad")


@pytest.mark.parametrize(("name", "value"), BAD, ids=BAD_IDS)
def test_the_decorator_refuses_with_submits_error(handler_name, name, value):
    expected = reference(name, value)
    with pytest.raises(HandlerRegistrationError) as raised:

        @reliable_task_handler(name=handler_name, **{name: value})
        def handler() -> None: ...

    # The decorator's own error type, saying where; the cause is submit's error, word for word.
    assert str(raised.value) == f"@reliable_task_handler(name={handler_name!r}): {expected}"
    assert_same(raised.value.__cause__, expected)
    assert get_handler(handler_name) is None


@pytest.mark.parametrize(("name", "value"), BAD, ids=BAD_IDS)
def test_a_declared_schedule_refuses_with_submits_error(handler_name, name, value):
    expected = reference(name, value)
    with pytest.raises(HandlerRegistrationError) as raised:

        @reliable_task_handler(name=handler_name, schedule=Schedule(every=60, **{name: value}))
        def handler() -> None: ...

    assert str(raised.value) == (
        f"@reliable_task_handler(name={handler_name!r}): schedule {handler_name!r}: {expected}"
    )
    assert_same(raised.value.__cause__, expected)
    assert get_handler(handler_name) is None


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, v in BAD if n in ("queue", "priority")])
def test_the_decorator_refuses_none_for_queue_and_priority(handler_name, name, value):
    """Queue and priority have a default in the decorator: None there is a bad value, not
    "not given"; the message is the one TaskOptions gives for None."""
    with pytest.raises(HandlerRegistrationError) as raised:

        @reliable_task_handler(name=handler_name, **{name: None})
        def handler() -> None: ...

    with pytest.raises(InvalidTaskOptionError) as direct:
        TaskOptions(**{name: None}).validate(required=(name,))
    assert_same(raised.value.__cause__, direct.value)
    assert str(direct.value) == f"{name} must be {_expected_words(name)}, got None"


def _expected_words(name: str) -> str:
    from django_reliable_executor.core.options import RULES

    return RULES[name][1]


# -- the Django Tasks backend -------------------------------------------------------------------
def _echo(*args: Any, **kwargs: Any) -> None:
    """A module-level function for the Django tasks built here."""


@pytest.fixture
def django_backend(storage, clock, monkeypatch) -> Iterator[Any]:
    """The configured backend, enqueueing through the module executor on the storage under test."""
    from django_reliable_executor.service.reliable_executor import executor as module_executor

    monkeypatch.setattr(module_executor, "_storage", storage)
    monkeypatch.setattr(module_executor, "_clock", clock)
    yield tasks_compat.task_backends["default"]
    unregister(f"{__name__}._echo")  # registered by validate_task


def _django_task(**changes: Any) -> Any:
    """A task of ``backend``'s task class, built without validation so that a bad option
    reaches validate_task and enqueue as it would from a hand-built task."""
    good = tasks_compat.task_backends["default"].task_class(
        func=_echo,
        priority=0,
        backend="default",
        queue_name="default",
        run_after=None,
        takes_context=False,
    )
    copy = object.__new__(type(good))
    for field in dataclasses.fields(good):
        object.__setattr__(copy, field.name, changes.get(field.name, getattr(good, field.name)))
    return copy


DJANGO_BAD = [(n, v) for n, v in BAD if n != "priority"]


@pytest.mark.parametrize(
    ("name", "value"), DJANGO_BAD, ids=[f"{n}={v!r}"[:40] for n, v in DJANGO_BAD]
)
def test_the_django_tasks_backend_refuses_a_tasks_option_with_submits_error(
    django_backend, executor, name, value
):
    """validate_task (run when a task is declared or changed with .using()) and enqueue raise
    Django's InvalidTaskError with submit's message; its cause is submit's error."""
    from django_reliable_executor.tasks_backend import ReliableExecutorBackend

    expected = reference(name, value)
    # A backend taking any queue name: Django's own QUEUES rule would answer first otherwise.
    backend = ReliableExecutorBackend("default", {"QUEUES": []})
    changes = {"queue_name": value} if name == "queue" else {name: value}
    task = _django_task(**changes)
    for call in (lambda: backend.validate_task(task), lambda: backend.enqueue(task, (), {})):
        with pytest.raises(tasks_compat.InvalidTaskError) as raised:
            call()
        assert str(raised.value) == str(expected)
        assert_same(raised.value.__cause__, expected)
    assert executor.list_tasks() == []


RETRY_BAD = [(n, v) for n, v in BAD if n in RETRY_NAMES]


@pytest.mark.parametrize(
    ("name", "value"),
    RETRY_BAD,
    ids=[f"{n}={v!r}"[:40] for n, v in RETRY_BAD],
)
def test_the_django_tasks_backend_options_are_refused_with_submits_message(
    django_backend, executor, name, value
):
    """A bad default in TASKS[...]["OPTIONS"]: system check E020 and every enqueue say what
    submit says, after where it was set."""
    from django_reliable_executor.tasks_backend import ReliableExecutorBackend

    expected = reference(name, value)
    backend = ReliableExecutorBackend("x", {"OPTIONS": {name: value}})
    assert [message.msg for message in backend.check()] == [f"TASKS['x']['OPTIONS']: {expected}"]
    with pytest.raises(tasks_compat.InvalidTaskError) as raised:
        backend.enqueue(_django_task(), (), {})
    assert str(raised.value) == f"TASKS['x']['OPTIONS']: {expected}"
    assert executor.list_tasks() == []


# -- the HTTP API -------------------------------------------------------------------------------
@pytest.fixture(params=admin_params(["default"]))
def api_service(request: pytest.FixtureRequest) -> Iterator[ReliableExecutor]:
    from tests.support.api_support import api_executor

    with api_executor(request.param) as service:
        yield service


@pytest.mark.parametrize(("name", "value"), BAD, ids=BAD_IDS)
def test_the_http_api_answers_400_with_submits_message(api_service, client, name, value):
    from tests.support.api_support import API, login

    expected = reference(name, value)
    operator = login(client, "view_reliabletask", "add_reliabletask", "operate_reliabletask")
    body = json.dumps({"task_name": TASK, name: value}).encode()
    response = operator.post(API, body, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json() == {"error": str(expected), "field": expected.field}
    assert api_service.list_tasks() == []


def test_each_option_comes_from_the_first_source_that_gives_it():
    class OnlyAQueue:  # carries one option of the six, like a Django Task's queue_name
        queue = "q"

    got = TaskOptions.of(
        None,
        TaskOptions(priority=3),
        OnlyAQueue(),
        TaskOptions(retry_limit=1, priority=9, queue="z"),
    )
    assert got == TaskOptions(retry_limit=1, priority=3, queue="q")
    complete = TaskOptions(1, 2, "fixed", None, "a", 5)
    assert TaskOptions.of(complete, TaskOptions(max_duration_millis=7)) == dataclasses.replace(
        complete, max_duration_millis=7
    )


def test_an_option_value_that_cannot_be_compared_is_refused_as_a_bad_value():
    class Incomparable:
        def __eq__(self, other: object) -> bool:
            raise ValueError("not comparable")

        __hash__ = None  # type: ignore[assignment]

    bad = Incomparable()
    with pytest.raises(InvalidTaskOptionError) as raised:
        TaskOptions.of(TaskOptions(queue=bad), TaskOptions(1, 2, "fixed", 3, "a", 5)).validate()
    assert raised.value.field == "queue"
    with pytest.raises(InvalidTaskOptionError):
        TaskOptions(queue="a\u2003b").validate()  # any Unicode whitespace, as before


def test_options_found_good_once_are_still_told_apart_by_type():
    """validate remembers good options; an equal value of another type is checked anew."""
    TaskOptions(priority=1, retry_limit=0).validate()
    with pytest.raises(InvalidTaskOptionError) as raised:
        TaskOptions(priority=True, retry_limit=0).validate()  # True == 1, but no priority
    assert raised.value.field == "priority"
    with pytest.raises(InvalidTaskOptionError) as raised:
        TaskOptions(priority=1, retry_limit=False).validate()
    assert raised.value.field == "retry_limit"
    TaskOptions(queue="a").validate()
    with pytest.raises(InvalidTaskOptionError) as raised:
        TaskOptions(queue="a").validate(required=["priority"])  # other names required
    assert raised.value.field == "priority"
    with pytest.raises(InvalidTaskOptionError) as raised:
        TaskOptions(queue=["a"]).validate()  # type: ignore[arg-type] # unhashable
    assert raised.value.field == "queue"
