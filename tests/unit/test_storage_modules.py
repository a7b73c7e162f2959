"""storage/base.py's table of where each interface method lives in the two backends holds."""

from __future__ import annotations

import inspect
import re

import pytest

from django_reliable_executor.storage import base
from django_reliable_executor.storage.base import TaskStorage
from django_reliable_executor.storage.database import DatabaseStorage
from django_reliable_executor.storage.redis import RedisStorage

# A table row: "    <database module> / <redis module>: method method ..."
ROW = re.compile(r"^ {4}([a-z_]+) / ([a-z_]+): ([a-z_ ]+)$")  # the names may start with "_"
BACKENDS = {"database": DatabaseStorage, "redis": RedisStorage}


def table() -> dict[str, tuple[str, str]]:
    """``{method: (database module, redis module)}`` as base.py's docstring writes it."""
    rows: dict[str, tuple[str, str]] = {}
    for line in (base.__doc__ or "").splitlines():
        match = ROW.match(line)
        if match:
            for method in match.group(3).split():
                assert method not in rows, f"{method} is in the table twice"
                rows[method] = (match.group(1), match.group(2))
    return rows


def interface_methods() -> list[str]:
    """The interface's public methods (ScheduleStorage's included), and the hooks its
    template methods call (claim -> _claim, list -> _list, count_tasks -> _count_tasks,
    throughput -> _minute_counts, completed_by_queue -> _completed_by_queue, purge_finished ->
    _purge_finished)."""
    hooks = [
        "_claim",
        "_completed_by_queue",
        "_count_tasks",
        "_list",
        "_minute_counts",
        "_purge_finished",
    ]
    public = [
        name
        for name, value in inspect.getmembers(TaskStorage)
        if not name.startswith("_") and inspect.isfunction(value)
    ]
    return sorted([*public, *hooks])


def home(storage_class: type, method: str) -> str:
    """The module, by its last name, of the class that defines ``method`` for the backend
    (``__init__``: the backend's package)."""
    for cls in storage_class.__mro__:
        if method in cls.__dict__:
            if cls.__module__.endswith((".storage.database", ".storage.redis")):
                return "__init__"
            return cls.__module__.rsplit(".", 1)[-1]
    raise AssertionError(f"{method} is defined nowhere")


def test_every_interface_method_is_in_the_table():
    assert sorted(table()) == interface_methods()


@pytest.mark.parametrize("method", interface_methods())
@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_each_method_lives_where_the_table_says(backend, method):
    database, redis = table()[method]
    expected = database if backend == "database" else redis
    assert home(BACKENDS[backend], method) == expected


DEFAULTS = {"base", "schedule_base", "lease_base", "batch_base", "step_base", "read_base"}


@pytest.mark.parametrize("method", sorted(table()))
def test_a_method_lives_in_the_same_module_on_both_sides_or_keeps_a_default(method):
    database, redis = table()[method]
    listing = method in ("_list", "_count_tasks")  # Redis's walks of its list indexes
    assert database == redis or {database, redis} & DEFAULTS or listing, (
        f"{method} lives in database/{database}.py but redis/{redis}.py"
    )
