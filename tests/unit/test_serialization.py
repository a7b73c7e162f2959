"""serialization: parameters and results to JSON and back, with the path of what does not fit."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Optional

import pytest

from django_reliable_executor.core.serialization import (
    ConversionError,
    dumps,
    from_json_value,
    to_json_value,
)

UTC = dt.timezone.utc
NOW = dt.datetime(2030, 1, 1, tzinfo=UTC)


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
