"""JSON in and out: turn parameters and results into plain JSON values and back into param types.

Only JSON ever reaches storage (never pickle), so nothing read back can make a worker run code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any

from .text import unstorable_char

# typing.Optional[X] and X | None have different origins.
_UNION_ORIGINS = (typing.Union, getattr(types, "UnionType", typing.Union))
# Integers shorter than this are under any int-to-text digit limit Python allows (at least 640
# digits, ~2,100 bits; 4300 by default): only longer ones pay for a trial conversion.
_LONG_INT_BITS = 2000


# How a result (a task's, a durable step's) no storage can take is refused: the start of the
# error recorded, or raised.
RESULT_REFUSED = "result cannot be stored"


class ConversionError(ValueError):
    """A value could not be turned into JSON, or JSON into the wanted type."""


def to_json_value(value: Any, path: str = "$") -> Any:
    """Plain JSON value for ``value``: dataclasses and pydantic models become dicts.

    Raises ConversionError naming the JSON path of the first value that is not JSON.
    """
    if isinstance(value, str):
        _check_text(value, path)
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if value.bit_length() > _LONG_INT_BITS:
            _check_digits(value, path)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConversionError(f"{path} is {value!r}, which JSON cannot represent")
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: to_json_value(getattr(value, f.name), f"{path}.{f.name}")
            for f in dataclasses.fields(value)
        }
    dump = getattr(value, "model_dump", None)  # pydantic v2
    if callable(dump) and not isinstance(value, type):
        return to_json_value(dump(mode="json"), path)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConversionError(f"{path} has a non-string key {key!r}")
            _check_text(key, f"{path} key {key!r}")
            out[key] = to_json_value(item, f"{path}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_json_value(item, f"{path}[{i}]") for i, item in enumerate(value)]
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    raise ConversionError(f"{path} is {article} {name}, which is not JSON-serialisable")


def _check_text(text: str, path: str) -> None:
    """Refuse text that some storage cannot hold, so every storage accepts the same values
    (text.unstorable_char: PostgreSQL's jsonb rejects NUL, and no storage takes a surrogate)."""
    problem = unstorable_char(text)
    if problem is not None:
        raise ConversionError(f"{path} contains {problem}, which no storage can hold")


def _check_digits(value: int, path: str) -> None:
    """Refuse an integer Python will not write as decimal text (over
    ``sys.get_int_max_str_digits()``): it could never be written to any storage."""
    try:
        str(value)
    except ValueError as exc:
        raise ConversionError(f"{path} is an integer too long to write as JSON: {exc}") from None


@dataclasses.dataclass(frozen=True)
class Encoded:
    """A value made plain and written as JSON text once, where it was produced (a handler's
    result, in the pool thread that ran it): storing it later cannot fail on the value itself."""

    value: Any
    text: str


NULL = Encoded(None, "null")


def encode(value: Any) -> Encoded:
    """``value`` as a plain JSON value and its text. Raises ConversionError saying why it
    cannot be stored: not JSON, an integer too long to write, or nested too deeply."""
    if value is None:  # what most handlers return
        return NULL
    try:
        plain = to_json_value(value)
        return Encoded(plain, dumps(plain))
    except ConversionError:
        raise
    except RecursionError:
        # Raised from hundreds of frames down: the chained traceback would only repeat them.
        raise ConversionError("the value is nested too deeply to write as JSON") from None
    except (ValueError, TypeError, OverflowError) as exc:
        raise ConversionError(f"{type(exc).__name__}: {exc}") from None


def encoded(result: Any) -> Encoded:
    """What a storage writes for ``result``: the Encoded a worker made, or encoded now for a
    caller that passed a plain value."""
    return result if isinstance(result, Encoded) else encode(result)


# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(value: Any) -> str:
    """Compact JSON text of a value already made plain by ``to_json_value``."""
    return _ENCODER.encode(value)


def loads(text: str) -> Any:
    """The value of JSON text; ``null`` (a task without a parameter) without the parser."""
    return None if text == "null" else json.loads(text)


_PLAIN_TYPES: dict[Any, tuple[type, ...]] = {
    int: (int,),
    float: (int, float),
    str: (str,),
    bool: (bool,),
    dict: (dict,),
    list: (list,),
}


def _check_plain(value: Any, annotation: Any, path: str) -> Any:
    """Convert/check ``value`` against a simple annotation; unknown annotations pass through."""
    origin = typing.get_origin(annotation)
    if annotation is Any or annotation is typing.Any:
        return value
    if origin in _UNION_ORIGINS:
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _check_plain(value, arg, path)
            except ConversionError as exc:
                errors.append(str(exc))
        raise ConversionError(errors[0] if errors else f"{path} does not match {annotation}")
    if origin in (list, dict):
        return _check_plain(value, origin, path)
    if dataclasses.is_dataclass(annotation) and isinstance(annotation, type):
        return from_json_value(value, annotation, path)
    expected = _PLAIN_TYPES.get(annotation)
    if expected is not None:
        if isinstance(value, bool) and annotation is not bool:
            raise ConversionError(f"{path} must be {annotation.__name__}, got bool")
        if not isinstance(value, expected):
            raise ConversionError(
                f"{path} must be {annotation.__name__}, got {type(value).__name__}"
            )
    return value


def from_json_value(value: Any, param_type: Any, path: str = "$") -> Any:
    """Turn a stored JSON value into ``param_type``; raises ConversionError saying why not."""
    if param_type is None or param_type is Any:
        return value
    validate = getattr(param_type, "model_validate", None)  # pydantic v2
    if callable(validate):
        try:
            return validate(value)
        except Exception as exc:  # pydantic's ValidationError, without importing pydantic
            raise ConversionError(f"{path} does not fit {param_type.__name__}: {exc}") from exc
    if dataclasses.is_dataclass(param_type) and isinstance(param_type, type):
        if not isinstance(value, dict):
            raise ConversionError(
                f"{path} must be an object for {param_type.__name__}, got {type(value).__name__}"
            )
        try:
            hints = typing.get_type_hints(param_type)
        except Exception:  # unresolved forward references: check names only
            hints = {}
        fields = {f.name: f for f in dataclasses.fields(param_type) if f.init}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ConversionError(
                f"{path} has unknown field(s) for {param_type.__name__}: {unknown}"
            )
        missing = [
            name
            for name, f in fields.items()
            if name not in value
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ConversionError(f"{path} is missing field(s) of {param_type.__name__}: {missing}")
        kwargs = {
            name: _check_plain(item, hints.get(name, Any), f"{path}.{name}")
            for name, item in value.items()
        }
        return param_type(**kwargs)
    if param_type in _PLAIN_TYPES or typing.get_origin(param_type) is not None:
        return _check_plain(value, param_type, path)
    try:
        return param_type(**value) if isinstance(value, dict) else param_type(value)
    except Exception as exc:
        name = getattr(param_type, "__name__", repr(param_type))
        raise ConversionError(f"{path} cannot be turned into {name}: {exc}") from exc
