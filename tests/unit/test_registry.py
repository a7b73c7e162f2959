"""registry: the handler decorator, its options and the names it registers."""

from __future__ import annotations

import pytest

from django_reliable_executor import registry, reliable_task_handler
from django_reliable_executor.exceptions import HandlerRegistrationError


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


def test_submit_goes_through_the_submitter_the_app_connected(names, monkeypatch):
    from django_reliable_executor.service.reliable_executor import executor

    # apps.ready() connected the service's submit: the registry never imports the service.
    assert registry._submitter == executor.submit
    names.append("units.sent")

    @reliable_task_handler(name="units.sent")
    def sent(param: int) -> None:
        pass

    calls = []
    monkeypatch.setattr(
        registry, "_submitter", lambda *args, **options: calls.append((args, options))
    )
    sent.submit(7, queue="q")
    assert calls == [(("units.sent", 7), {"queue": "q"})]

    monkeypatch.setattr(registry, "_submitter", None)
    with pytest.raises(RuntimeError, match="needs the executor"):
        sent.submit(7)
