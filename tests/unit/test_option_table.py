"""The option table (core/options.OPTIONS) against every signature that takes task options:
each takes exactly the options the table says it does, and each stored option has its field."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from django_reliable_executor.api.schedules import DEFINE_FIELDS
from django_reliable_executor.api.tasks import SUBMIT_FIELDS
from django_reliable_executor.conf import _RULES as SETTING_RULES
from django_reliable_executor.conf import ExecutorSettings
from django_reliable_executor.core import options
from django_reliable_executor.core.records import NewTask, SubmitOptions, TaskSubmitRequest
from django_reliable_executor.registry import TaskHandler, reliable_task_handler
from django_reliable_executor.schedules.records import Schedule
from django_reliable_executor.tasks_backend import OPTION_KEYS, ReliableTask
from django_reliable_executor.tasks_compat import Task

# What each signature names that is no task option: what the task is, and (for a schedule)
# when it fires.
SUBMIT_OTHERS = {"task_name", "task_parameter", "task_id"}
DECORATOR_OTHERS = {"name", "schedule", "unknown"}
HANDLER_OTHERS = {"func", "name", "origin"}
SCHEDULE_OTHERS = {
    "every",
    "cron",
    "timezone",
    "schedule_id",
    "task_name",
    "parameter",
    "start_at",
    "misfire",
    "overlap",
}


def _parameters(func: object) -> set[str]:
    return set(inspect.signature(func).parameters) - {"self"}  # type: ignore[arg-type]


def _fields(cls: type) -> set[str]:
    return {field.name for field in dataclasses.fields(cls)}


@pytest.mark.parametrize(
    ("entry_point", "names", "others"),
    [
        (options.SUBMIT, _fields(TaskSubmitRequest), SUBMIT_OTHERS),
        (options.SUBMIT, set(SUBMIT_FIELDS), SUBMIT_OTHERS),
        (options.SUBMIT, set(SubmitOptions.__annotations__), {"task_id"}),
        (options.DECORATOR, _parameters(reliable_task_handler), DECORATOR_OTHERS),
        (options.DECORATOR, _parameters(TaskHandler.__init__), HANDLER_OTHERS),
        (options.SCHEDULE, _fields(Schedule), SCHEDULE_OTHERS),
        (options.SCHEDULE, set(DEFINE_FIELDS), SCHEDULE_OTHERS),
        (options.TASKS_BACKEND, set(OPTION_KEYS), set()),
        (options.TASKS_BACKEND, _fields(ReliableTask) - _fields(Task), set()),
    ],
    ids=[
        "TaskSubmitRequest",
        "api-submit",
        "SubmitOptions",
        "reliable_task_handler",
        "TaskHandler",
        "Schedule",
        "api-schedules",
        "tasks_backend-OPTIONS",
        "ReliableTask",
    ],
)
def test_each_entry_point_takes_exactly_the_options_of_the_table(
    entry_point: str, names: set[str], others: set[str]
) -> None:
    assert others <= names
    assert names - others == set(options.options_of(entry_point))


def test_every_option_with_a_setting_has_that_setting_and_its_rule() -> None:
    settings = _fields(ExecutorSettings)
    for option in options.OPTIONS.values():
        if options.SETTINGS in option.takes:
            assert option.setting in settings, option.name
            assert SETTING_RULES[option.setting] == (option.test, option.expected)
        else:
            assert option.setting is None, option.name


def test_every_stored_option_names_a_field_of_the_stored_task() -> None:
    stored = _fields(NewTask)
    for option in options.OPTIONS.values():
        assert option.stored is None or option.stored in stored, option.name


def test_task_options_holds_the_options_of_every_entry_point_but_submit_and_decorator_only() -> (
    None
):
    # TaskOptions merges a submit's, a handler's and the settings' values: the options taken
    # by more than the submit and the decorator.
    shared = {
        name
        for name, option in options.OPTIONS.items()
        if option.takes & {options.SCHEDULE, options.TASKS_BACKEND, options.SETTINGS}
    }
    assert shared - {"retry_on"} == set(options.NAMES)
    assert list(options.RULES) == list(options.OPTIONS)
