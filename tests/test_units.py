"""Pure functions without a database: backoff, JSON conversion, settings, registry, state table."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from typing import Any, Optional

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_reliable_executor import TaskStatus, registry, reliable_task_handler
from django_reliable_executor.checks import check_settings
from django_reliable_executor.conf import KNOWN_KEYS, ExecutorSettings, get_settings, validate
from django_reliable_executor.exceptions import (
    HandlerRegistrationError,
    InvalidParameterError,
    InvalidTaskIdError,
    InvalidTaskOptionError,
    ParameterTooLargeError,
    ReliableExecutorError,
    TaskSubmitError,
    UnknownTaskError,
)
from django_reliable_executor.retries import JITTER, after_failure, backoff_millis
from django_reliable_executor.serialization import (
    ConversionError,
    dumps,
    from_json_value,
    to_json_value,
)
from django_reliable_executor.states import (
    FAILURE_STATUSES,
    RETRYABLE_BY_HAND,
    TERMINAL_STATUSES,
    TRANSITIONS,
    WAITING_STATUSES,
    can_transition,
)

UTC = dt.timezone.utc
NOW = dt.datetime(2030, 1, 1, tzinfo=UTC)
S = TaskStatus


# -- retries.backoff_millis -------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 5, 100])
def test_fixed_backoff_is_the_interval_for_every_retry(n):
    assert backoff_millis(n, 1500, "fixed", 10, rand=lambda: 0.0) == 1500


@pytest.mark.parametrize(("n", "nominal"), [(1, 1000), (2, 2000), (3, 4000), (6, 32000)])
def test_exponential_backoff_doubles(n, nominal):
    assert backoff_millis(n, 1000, "exponential", 10**9, rand=lambda: 0.5) == nominal
    assert backoff_millis(n, 1000, "exponential", 10**9, rand=lambda: 0.0) == int(nominal * 0.9)
    assert backoff_millis(n, 1000, "exponential", 10**9, rand=lambda: 1.0) == int(nominal * 1.1)


def test_exponential_backoff_jitter_stays_within_ten_percent():
    rng = random.Random(7)
    delays = [backoff_millis(3, 1000, "exponential", 10**9, rand=rng.random) for _ in range(2000)]
    assert JITTER == 0.10
    assert min(delays) >= 3600
    assert max(delays) <= 4400
    assert len(set(delays)) > 100  # actually spread out


def test_exponential_backoff_is_capped_and_jitter_never_exceeds_the_cap():
    assert backoff_millis(10, 1000, "exponential", 60000, rand=lambda: 0.5) == 60000
    assert backoff_millis(10, 1000, "exponential", 60000, rand=lambda: 1.0) == 60000
    assert backoff_millis(10, 1000, "exponential", 60000, rand=lambda: 0.0) == 54000


def test_exponential_backoff_with_a_huge_retry_number_stays_capped():
    assert backoff_millis(10**9, 1000, "exponential", 300000, rand=lambda: 0.5) == 300000


def test_zero_interval_is_zero_delay():
    assert backoff_millis(4, 0, "exponential", 300000, rand=lambda: 1.0) == 0
    assert backoff_millis(4, 0, "fixed", 300000) == 0


def test_backoff_rejects_bad_arguments():
    with pytest.raises(ValueError, match="starts at 1"):
        backoff_millis(0, 1000, "fixed", 1000)
    with pytest.raises(ValueError, match="linear"):
        backoff_millis(1, 1000, "linear", 1000)


# -- retries.after_failure --------------------------------------------------------------------
def _after(**overrides: Any):
    arguments = dict(
        budget_attempts=1,
        retry_limit=3,
        retryable=True,
        cancel_requested=False,
        deadline_at=None,
        now=NOW,
        retry_interval=2000,
        retry_backoff="fixed",
        backoff_cap_millis=300000,
    )
    arguments.update(overrides)
    return after_failure(**arguments)


def test_after_failure_with_retries_left_is_pending_after_backoff():
    assert _after() == (S.PENDING, NOW + dt.timedelta(seconds=2))
    assert _after(budget_attempts=3) == (S.PENDING, NOW + dt.timedelta(seconds=2))


def test_after_failure_with_exponential_backoff_uses_the_budget_attempt():
    status, run_at = _after(budget_attempts=3, retry_backoff="exponential")
    assert status is S.PENDING
    assert dt.timedelta(seconds=7.2) <= run_at - NOW <= dt.timedelta(seconds=8.8)


def test_after_failure_with_retries_used_up_is_failed():
    assert _after(budget_attempts=4) == (S.FAILED, None)
    assert _after(budget_attempts=1, retry_limit=0) == (S.FAILED, None)


def test_after_failure_outside_retry_on_is_failed():
    assert _after(retryable=False) == (S.FAILED, None)


def test_after_failure_past_the_deadline_is_timeout():
    assert _after(deadline_at=NOW) == (S.TIMEOUT, None)
    assert _after(deadline_at=NOW - dt.timedelta(seconds=1), retryable=False) == (S.TIMEOUT, None)
    assert _after(deadline_at=NOW + dt.timedelta(microseconds=1))[0] is S.PENDING


def test_after_failure_requested_cancel_wins():
    assert _after(cancel_requested=True) == (S.CANCELLED, None)
    assert _after(cancel_requested=True, deadline_at=NOW, budget_attempts=9) == (S.CANCELLED, None)


# -- serialization ----------------------------------------------------------------------------
@dataclasses.dataclass
class Address:
    city: str
    zip_code: Optional[str] = None  # noqa: UP045 - typing.Optional is supported too


@dataclasses.dataclass
class Customer:
    name: str
    score: float
    tags: list[str] = dataclasses.field(default_factory=list)
    address: Address | None = None
    extra: dict = dataclasses.field(default_factory=dict)
    anything: Any = None


class ModelLike:
    """Quacks like a pydantic v2 model, without pydantic."""

    def __init__(self, value: int) -> None:
        self.value = value

    def model_dump(self, mode: str = "python") -> dict:
        assert mode == "json"
        return {"value": self.value}

    @classmethod
    def model_validate(cls, data: Any) -> ModelLike:
        if not isinstance(data, dict) or not isinstance(data.get("value"), int):
            raise TypeError("value must be an int")
        return cls(data["value"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ModelLike) and other.value == self.value


class Point:
    def __init__(self, x: int, y: int = 0) -> None:
        self.x, self.y = x, y


def test_to_json_value_turns_dataclasses_models_and_tuples_into_plain_json():
    customer = Customer("Ada", 9.5, ["a"], Address("Paris"), {"k": (1, 2)}, ModelLike(3))
    assert to_json_value(customer) == {
        "name": "Ada",
        "score": 9.5,
        "tags": ["a"],
        "address": {"city": "Paris", "zip_code": None},
        "extra": {"k": [1, 2]},
        "anything": {"value": 3},
    }
    assert to_json_value([True, None, 1, "s", 2.5]) == [True, None, 1, "s", 2.5]


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (float("nan"), "$"),
        ({"a": [1, float("inf")]}, "$.a[1]"),
        ({"a": {1: "x"}}, "$.a"),
        ([{1, 2}], "$[0]"),
        (Customer("x", 1.0, extra={"when": NOW}), "$.extra.when"),
        (Customer, "$"),  # a class, not an instance
        ({"s": "nul\x00"}, "$.s"),
        (["\ud800"], "$[0]"),
        ({"k\x00": 1}, "$ key"),
    ],
    ids=["nan", "inf", "int-key", "set", "datetime", "class", "nul", "surrogate", "nul-key"],
)
def test_to_json_value_names_the_path_of_what_is_not_json(value, path):
    with pytest.raises(ConversionError) as raised:
        to_json_value(value)
    assert str(raised.value).startswith(path)


def test_dumps_is_compact_utf8_and_refuses_nan():
    assert dumps({"a": [1, "é"], "b": None}) == '{"a":[1,"é"],"b":null}'
    with pytest.raises(ValueError):
        dumps(float("nan"))


def test_from_json_value_builds_dataclasses_recursively():
    data = {
        "name": "Ada",
        "score": 9,  # an int is a fine float
        "address": {"city": "Paris", "zip_code": None},
        "tags": ["x"],
    }
    customer = from_json_value(data, Customer)
    assert customer == Customer("Ada", 9, ["x"], Address("Paris"), {}, None)
    assert isinstance(customer.address, Address)
    assert from_json_value(to_json_value(customer), Customer) == customer


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"score": 1.0}, "missing field(s) of Customer: ['name']"),
        ({"name": "a", "score": 1.0, "age": 3}, "unknown field(s) for Customer: ['age']"),
        ({"name": 1, "score": 1.0}, "$.name must be str, got int"),
        ({"name": "a", "score": True}, "$.score must be float, got bool"),
        ({"name": "a", "score": "1"}, "$.score must be float, got str"),
        ({"name": "a", "score": 1.0, "tags": "x"}, "$.tags must be list, got str"),
        ({"name": "a", "score": 1.0, "extra": []}, "$.extra must be dict, got list"),
        ({"name": "a", "score": 1.0, "address": {}}, "$.address is missing field(s)"),
        ({"name": "a", "score": 1.0, "address": "Paris"}, "$.address must be an object"),
        (["Ada", 1.0], "$ must be an object for Customer, got list"),
    ],
    ids=[
        "missing",
        "unknown",
        "str",
        "bool-float",
        "str-float",
        "list",
        "dict",
        "nested-missing",
        "nested-type",
        "not-object",
    ],
)
def test_from_json_value_says_why_a_dataclass_does_not_fit(data, message):
    with pytest.raises(ConversionError) as raised:
        from_json_value(data, Customer)
    assert message in str(raised.value)


def test_from_json_value_with_plain_types():
    assert from_json_value({"a": 1}, None) == {"a": 1}
    assert from_json_value({"a": 1}, Any) == {"a": 1}
    assert from_json_value(3, int) == 3
    assert from_json_value(3, float) == 3
    assert from_json_value([1], list[int]) == [1]
    for value, param_type in [("3", int), (True, int), (1, bool), ([1], dict), ({}, list)]:
        with pytest.raises(ConversionError):
            from_json_value(value, param_type)


def test_from_json_value_uses_model_validate_when_present():
    assert from_json_value({"value": 4}, ModelLike) == ModelLike(4)
    with pytest.raises(ConversionError, match="does not fit ModelLike: value must be an int"):
        from_json_value({"value": "4"}, ModelLike)


def test_from_json_value_calls_other_classes_with_the_value():
    point = from_json_value({"x": 1, "y": 2}, Point)
    assert (point.x, point.y) == (1, 2)
    assert from_json_value("2030-01-01", dt.date.fromisoformat) == dt.date(2030, 1, 1)
    with pytest.raises(ConversionError, match="cannot be turned into Point"):
        from_json_value({"z": 1}, Point)


def test_from_json_value_with_unresolvable_annotations_checks_names_only():
    @dataclasses.dataclass
    class Loose:
        thing: NotDefinedAnywhere  # type: ignore[name-defined]  # noqa: F821

    assert from_json_value({"thing": [1]}, Loose).thing == [1]
    with pytest.raises(ConversionError, match="unknown field"):
        from_json_value({"other": 1}, Loose)


# -- settings and system checks ---------------------------------------------------------------
BAD_SETTINGS = {
    "STORAGE": ["mongo", None],
    "DATABASE_ALIAS": ["", "   ", 3],
    "REDIS_URL": ["http://localhost", 6379],
    "REDIS_CACHE_ALIAS": ["", 5],
    "REDIS_CLUSTER": ["yes", 1, None],
    "REDIS_SENTINEL": ["mymaster", {}, {"sentinels": [], "service_name": "m"}],
    "REDIS_OPTIONS": [None, [], {1: 2}],
    "KEY_PREFIX": ["", "a b", "with{brace}", None],
    "CORE_POOL_SIZE": [0, -1, True, 2.0],
    "MAX_POOL_SIZE": [0, "10"],
    "QUEUE_CAPACITY": [-1, 1.5],
    "POLL_INTERVAL": [0, -0.5, "1", False],
    "LEASE_TIMEOUT": [0, None],
    "MASTER_LOCK_TTL": [0, "10"],
    "DEFAULT_RETRY_LIMIT": [-1, 2.0, True],
    "DEFAULT_RETRY_INTERVAL": [-1, 0.5],
    "DEFAULT_RETRY_BACKOFF": ["linear", None],
    "DEFAULT_RETRY_BACKOFF_MAX": [-1, "300000"],
    "DEFAULT_MAX_DURATION": [0, -1, 1.5, True],
    "FINISHED_RETENTION": [-1, "7d"],
    "MAX_PARAMETER_BYTES": [0, 1.5],
    "ALLOW_UNKNOWN_TASKS": ["yes", 1, None],
    "METRICS_PORT": [-1, 65536, "9100", True],
    "API_KEYS": [["k"], {"k": "short"}, {"bad id": "s" * 32}, {"": "s" * 32}, {"k": 123}],
    "API_SIGNATURE_WINDOW": [0, -5, 3601, "300", True, None],
    "SCHEDULE_MISFIRE_GRACE": [-1, "60", True, None],
    "SCHEDULE_CATCH_UP_LIMIT": [0, -1, 1.5, True],
}
GOOD_SETTINGS = {
    "STORAGE": "redis",
    "DATABASE_ALIAS": "other",
    "REDIS_URL": "rediss://cache:6380/2",
    "REDIS_CACHE_ALIAS": "redis",
    "REDIS_CLUSTER": False,  # True, or a REDIS_SENTINEL, would conflict with REDIS_CACHE_ALIAS
    "REDIS_SENTINEL": None,
    "REDIS_OPTIONS": {"ssl_ca_certs": "/etc/ssl/redis-ca.pem", "socket_timeout": 3},
    "KEY_PREFIX": "shop",
    "CORE_POOL_SIZE": 2,
    "MAX_POOL_SIZE": 4,
    "QUEUE_CAPACITY": 0,
    "POLL_INTERVAL": 0.2,
    "LEASE_TIMEOUT": 30,
    "MASTER_LOCK_TTL": 5.5,
    "DEFAULT_RETRY_LIMIT": 0,
    "DEFAULT_RETRY_INTERVAL": 0,
    "DEFAULT_RETRY_BACKOFF": "exponential",
    "DEFAULT_RETRY_BACKOFF_MAX": 0,
    "DEFAULT_MAX_DURATION": 1,
    "FINISHED_RETENTION": 0,
    "MAX_PARAMETER_BYTES": 1,
    "ALLOW_UNKNOWN_TASKS": True,
    "METRICS_PORT": 0,
    "API_KEYS": {"ops-1": "s" * 32},
    "API_SIGNATURE_WINDOW": 60,
    "SCHEDULE_MISFIRE_GRACE": 0,
    "SCHEDULE_CATCH_UP_LIMIT": 1,
}


def test_every_key_is_covered_here():
    assert set(BAD_SETTINGS) == set(GOOD_SETTINGS) == KNOWN_KEYS


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, value) for key, values in BAD_SETTINGS.items() for value in values],
)
def test_validate_names_the_bad_key(key, value):
    problems = validate({key: value})
    assert [k for k, _ in problems] == [key]
    assert f"RELIABLE_EXECUTOR[{key!r}]" in problems[0][1]
    if key == "API_KEYS" and isinstance(value, dict):  # the secrets are masked
        assert repr({key_id: "***" for key_id in value}) in problems[0][1]
        assert all(str(secret) not in problems[0][1] for secret in value.values())
    else:
        assert repr(value) in problems[0][1]


def test_validate_accepts_good_values_and_nothing():
    assert validate(GOOD_SETTINGS) == []
    assert validate({}) == []
    assert validate(None) == []


def test_validate_reports_unknown_keys_and_non_dicts():
    assert validate({"LEASE_TIMOUT": 5}) == [
        ("LEASE_TIMOUT", "RELIABLE_EXECUTOR['LEASE_TIMOUT'] is not a known key")
    ]
    [(key, message)] = validate(["STORAGE"])
    assert key == "RELIABLE_EXECUTOR"
    assert "must be a dict" in message


def test_validate_max_pool_size_below_core_pool_size():
    [(key, message)] = validate({"CORE_POOL_SIZE": 8, "MAX_POOL_SIZE": 4})
    assert key == "MAX_POOL_SIZE"
    assert "CORE_POOL_SIZE" in message
    [(key, _)] = validate({"CORE_POOL_SIZE": 11})  # the default MAX_POOL_SIZE is 10
    assert key == "MAX_POOL_SIZE"


def test_validate_reports_every_problem():
    problems = validate({"STORAGE": "x", "LEASE_TIMEOUT": 0, "NOPE": 1})
    assert sorted(key for key, _ in problems) == ["LEASE_TIMEOUT", "NOPE", "STORAGE"]


@pytest.mark.parametrize("key", sorted(BAD_SETTINGS))
def test_system_check_error_names_the_key(key):
    with override_settings(RELIABLE_EXECUTOR={key: BAD_SETTINGS[key][0]}):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E001", key)]
    assert key in errors[0].msg


def test_system_check_passes_on_the_test_settings():
    assert check_settings() == []


def test_system_check_unknown_database_alias():
    with override_settings(RELIABLE_EXECUTOR={"DATABASE_ALIAS": "nowhere"}):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E002", "DATABASE_ALIAS")]
    assert "DATABASE_ALIAS" in errors[0].msg


def test_system_check_unknown_cache_alias():
    settings = {"STORAGE": "redis", "REDIS_CACHE_ALIAS": "nowhere"}
    with override_settings(RELIABLE_EXECUTOR=settings):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E003", "REDIS_CACHE_ALIAS")]


def test_database_check_reports_an_unreachable_task_database():
    from django.db import connections

    from django_reliable_executor.checks import check_database

    wrapper = connections["postgres"]
    wrapper.close()
    port = wrapper.settings_dict["PORT"]
    wrapper.settings_dict["PORT"] = "1"  # nothing listens there
    try:
        with override_settings(RELIABLE_EXECUTOR={"DATABASE_ALIAS": "postgres"}):
            errors = check_database(databases=["postgres"])
    finally:
        wrapper.close()
        wrapper.settings_dict["PORT"] = port
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E006", "DATABASE_ALIAS")]
    assert "cannot be reached" in errors[0].msg


def test_system_check_needs_use_tz():
    with override_settings(USE_TZ=False):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E004", "USE_TZ")]


def test_get_settings_follows_overrides_and_refuses_bad_values():
    base = get_settings()
    with override_settings(RELIABLE_EXECUTOR={"LEASE_TIMEOUT": 5, "QUEUE_CAPACITY": 3}):
        current = get_settings()
        assert (current.LEASE_TIMEOUT, current.QUEUE_CAPACITY) == (5.0, 3)
        assert isinstance(current.LEASE_TIMEOUT, float)
    with (
        override_settings(RELIABLE_EXECUTOR={"QUEUE_CAPACITY": -1}),
        pytest.raises(ImproperlyConfigured, match="QUEUE_CAPACITY"),
    ):
        get_settings()
    assert get_settings() == base


def test_executor_settings_defaults_match_the_design():
    defaults = ExecutorSettings()
    assert (defaults.CORE_POOL_SIZE, defaults.MAX_POOL_SIZE, defaults.QUEUE_CAPACITY) == (
        5,
        10,
        100,
    )
    assert (defaults.DEFAULT_RETRY_LIMIT, defaults.DEFAULT_RETRY_INTERVAL) == (3, 2000)
    assert (defaults.DEFAULT_RETRY_BACKOFF, defaults.DEFAULT_RETRY_BACKOFF_MAX) == ("fixed", 300000)
    assert defaults.MAX_PARAMETER_BYTES == 1048576
    assert defaults.ALLOW_UNKNOWN_TASKS is False
    assert validate(dataclasses.asdict(defaults)) == []


# -- registry ---------------------------------------------------------------------------------
@pytest.fixture
def names():
    """Task names registered by a test; unregistered afterwards."""
    registered: list[str] = []
    yield registered
    for name in registered:
        registry.unregister(name)


def test_decorator_registers_a_directly_callable_handler(names):
    names.append("units.add")

    @reliable_task_handler(name="units.add", queue="math", priority=3, retry_on=ValueError)
    def add(param: dict) -> int:
        return param["a"] + param["b"]

    assert add({"a": 1, "b": 2}) == 3
    assert registry.get_handler("units.add") is add
    assert (add.queue, add.priority, add.retry_on) == ("math", 3, (ValueError,))
    assert (add.retry_limit, add.retry_interval, add.max_duration_millis) == (None, None, None)
    assert callable(add.submit)
    assert add.__name__ == "add"
    assert "units.add" in registry.all_handlers()


def test_default_name_is_module_and_qualname(names):
    @reliable_task_handler()
    def unnamed() -> None:
        pass

    names.append(unnamed.name)
    assert unnamed.name == f"{__name__}.test_default_name_is_module_and_qualname.<locals>.unnamed"
    assert registry.get_handler(unnamed.name) is unnamed


def test_a_second_function_under_the_same_name_is_refused(names):
    names.append("units.dup")

    @reliable_task_handler(name="units.dup")
    def first() -> None:
        pass

    with pytest.raises(HandlerRegistrationError, match="units.dup.*already registered.*first"):

        @reliable_task_handler(name="units.dup")
        def second() -> None:
            pass

    assert registry.get_handler("units.dup") is first


def test_re_registering_the_same_function_replaces_it(names):
    names.append("units.same")

    def make():
        @reliable_task_handler(name="units.same")
        def handler() -> str:
            return "x"

        return handler

    first, second = make(), make()  # a module imported twice defines it twice
    assert first is not second
    assert registry.get_handler("units.same") is second


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"name": "n" * 192}, "name"),
        ({"retry_limit": -1}, "retry_limit"),
        ({"retry_limit": True}, "retry_limit"),
        ({"retry_limit": "3"}, "retry_limit"),
        ({"retry_interval": -1}, "retry_interval"),
        ({"retry_interval": 1.5}, "retry_interval"),
        ({"retry_backoff": "linear"}, "retry_backoff"),
        ({"max_duration_millis": 0}, "max_duration_millis"),
        ({"max_duration_millis": True}, "max_duration_millis"),
        ({"max_duration_millis": 2.5}, "max_duration_millis"),
        ({"queue": ""}, "queue"),
        ({"queue": None}, "queue"),
        ({"queue": "two words"}, "queue"),
        ({"queue": "a,b"}, "queue"),
        ({"queue": "q" * 101}, "queue"),
        ({"priority": True}, "priority"),
        ({"priority": "high"}, "priority"),
        ({"retry_on": ("ValueError",)}, "retry_on"),
        ({"retry_on": (int,)}, "retry_on"),
    ],
    ids=lambda value: (
        "-".join(f"{k}={v!r}"[:30] for k, v in value.items()) if isinstance(value, dict) else None
    ),
)
def test_bad_decorator_options_are_refused_at_import(names, options, named):
    names.append("units.bad")
    arguments = {"name": "units.bad", **options}
    with pytest.raises(HandlerRegistrationError) as raised:

        @reliable_task_handler(**arguments)
        def handler() -> None:
            pass

    assert named in str(raised.value)
    assert registry.get_handler("units.bad") is None


def test_whether_a_handler_takes_a_parameter(names):
    def register(name: str, func, **options):
        names.append(name)
        return reliable_task_handler(name=name, **options)(func)

    def none() -> None: ...
    def one(param) -> None: ...
    def context_only(context) -> None: ...
    def both(param, context) -> None: ...
    def star(*args) -> None: ...
    def keyword_only(*, flag=False) -> None: ...

    assert register("units.p0", none).accepts_parameter is False
    assert register("units.p1", one).accepts_parameter is True
    assert register("units.p2", context_only, takes_context=True).accepts_parameter is False
    assert register("units.p3", both, takes_context=True).accepts_parameter is True
    assert register("units.p4", star).accepts_parameter is True
    assert register("units.p5", keyword_only).accepts_parameter is False
    assert register("units.p6", none, param_type=dict).accepts_parameter is True


# -- exceptions -------------------------------------------------------------------------------
def test_every_submit_error_is_a_task_submit_error_and_a_value_error():
    for error in (
        InvalidTaskIdError,
        UnknownTaskError,
        InvalidParameterError,
        ParameterTooLargeError,
        InvalidTaskOptionError,
    ):
        assert issubclass(error, TaskSubmitError)
        assert issubclass(error, ValueError)
        assert issubclass(error, ReliableExecutorError)
    assert issubclass(ParameterTooLargeError, InvalidParameterError)
    assert not issubclass(HandlerRegistrationError, TaskSubmitError)
    assert TaskSubmitError("m", field="task_id").field == "task_id"


# -- the state table --------------------------------------------------------------------------
def test_terminal_and_waiting_statuses():
    assert {S.COMPLETED, S.FAILED, S.TIMEOUT, S.CANCELLED, S.ERROR} == TERMINAL_STATUSES
    assert {S.CREATED, S.PENDING} == WAITING_STATUSES
    assert TERMINAL_STATUSES - {S.COMPLETED} == RETRYABLE_BY_HAND
    assert {S.FAILED, S.TIMEOUT, S.ERROR} == FAILURE_STATUSES
    assert [s for s in S if s.is_terminal] == [s for s in S if s in TERMINAL_STATUSES]
    assert set(TRANSITIONS) == set(S)


ALLOWED = {
    (S.CREATED, S.RUNNING),
    (S.CREATED, S.CANCELLED),
    (S.CREATED, S.TIMEOUT),
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.CANCELLED),
    (S.PENDING, S.TIMEOUT),
    (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.PENDING),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.TIMEOUT),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.ERROR),
    (S.FAILED, S.PENDING),
    (S.TIMEOUT, S.PENDING),
    (S.CANCELLED, S.PENDING),
    (S.ERROR, S.PENDING),
}


@pytest.mark.parametrize("source", list(S))
def test_transition_table_is_exactly_the_design(source):
    for target in S:
        assert can_transition(source, target) == ((source, target) in ALLOWED), (source, target)


def test_completed_is_final_and_nothing_returns_to_created():
    assert TRANSITIONS[S.COMPLETED] == frozenset()
    assert not any(can_transition(source, S.CREATED) for source in S)


def test_status_is_a_plain_string():
    assert S.RUNNING == "RUNNING"
    assert str(S.RUNNING) == "RUNNING"
    assert S("PENDING") is S.PENDING
    assert len(S) == 8


def test_group_committer_writes_an_item_the_store_refuses_alone():
    """A batch the store refuses is flushed again item by item: only the caller whose own item
    is refused gets the error; an error that is not a refusal still reaches every caller."""
    import threading
    import time

    from django_reliable_executor.batching import GroupCommitter

    held = threading.Event()
    flushed: list[list[str]] = []

    def flush(items: list[str]) -> list[str]:
        flushed.append(list(items))
        if items == ["first"]:
            held.wait(10)  # the others gather into one batch meanwhile
        if "down" in items:
            raise ConnectionError("store down")
        if "bad" in items:
            raise ValueError("refused")
        return [f"ok {item}" for item in items]

    committer: GroupCommitter[str, str] = GroupCommitter(
        flush, isolate=lambda exc: isinstance(exc, ValueError)
    )
    outcomes: dict[str, object] = {}

    def submit(item: str) -> None:
        try:
            outcomes[item] = committer.submit(item)
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            outcomes[item] = exc

    def gather(items: list[str]) -> None:
        threads = [threading.Thread(target=submit, args=("first",))]
        threads[0].start()
        while not flushed or flushed[-1] != ["first"]:
            time.sleep(0.001)
        for item in items:
            threads.append(threading.Thread(target=submit, args=(item,)))
            threads[-1].start()
        while len(committer._waiting) < len(items):
            time.sleep(0.001)
        held.set()
        for thread in threads:
            thread.join(10)
        held.clear()

    gather(["a", "bad", "b"])
    assert outcomes["a"] == "ok a" and outcomes["b"] == "ok b"
    assert isinstance(outcomes["bad"], ValueError)
    assert ["a", "bad", "b"] in flushed and ["a"] in flushed

    flushed.clear()
    outcomes.clear()
    gather(["c", "down"])
    assert isinstance(outcomes["c"], ConnectionError) and isinstance(
        outcomes["down"], ConnectionError
    )
    assert flushed == [["first"], ["c", "down"]]
