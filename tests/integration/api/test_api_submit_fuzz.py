"""Odd JSON in every field of ``POST tasks/``, on every storage: never a 5xx, and a refusal stores
nothing (fixed odd values per field, then random bodies); and the Python submit path with odd
``depends_on`` types."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_reliable_executor.api.tasks import SUBMIT_FIELDS
from django_reliable_executor.core.records import TaskSubmitRequest
from django_reliable_executor.exceptions import InvalidDependencyError
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import redis_client
from tests.support.api_support import API, HOOK, login, post_json

# Values no field takes as they are, or only some do: every JSON type, edges of each.
ODD_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**31,
    2**63,
    10**30,
    -(10**30),
    1.5,
    -0.0,
    1e308,
    "",
    " ",
    "\x00",
    "a\x00b",
    "\ud800",
    "é\u200b",
    "x" * 5000,
    "2030-01-01T00:00:00+00:00",
    [],
    [None],
    [[]],
    [{}],
    ["a", ["b"]],
    [1, 2],
    ["a\x00"],
    ["\udfff"],
    ["x" * 300],
    ["ok", "ok"],
    {},
    {"a": 1},
    {"a": {"b": [None]}},
    {"\x00": "\ud800"},
]
# Bodies json.dumps cannot write: the literals Python's parser also accepts, deep nesting.
RAW_ODD_VALUES = ["NaN", "Infinity", "-Infinity", "[" * 50_000 + "]" * 50_000, '"\\udc80"']


def stored_state(service: ReliableExecutor) -> tuple[int, frozenset[str]]:
    """How many tasks are stored, and on Redis every key of the executor's prefix."""
    count = sum(service.count_by_status().values())
    keys: frozenset[str] = frozenset()
    if service.settings.STORAGE == "redis":
        client = redis_client()
        try:
            keys = frozenset(client.scan_iter(match="{" + service.settings.KEY_PREFIX + "}*"))
        finally:
            client.close()
    return count, keys


def check_submit(service: ReliableExecutor, client: Any, body: bytes) -> None:
    """POST ``body``: no 5xx; a 4xx stores nothing; a 201 stores one task, readable back."""
    before = stored_state(service)
    response = post_json(client, API, body)
    assert response.status_code < 500, (body[:300], response.content[:500])
    answer = response.json()  # every answer is JSON
    if response.status_code >= 400:
        assert isinstance(answer["error"], str) and answer["error"]
        if isinstance(answer.get("field"), str):
            assert answer["field"] in SUBMIT_FIELDS or answer["field"] == "task_name"
        assert stored_state(service)[0] == before[0], (body[:300], answer)
        if service.settings.STORAGE == "redis":
            assert stored_state(service)[1] == before[1], (body[:300], answer)
    else:
        assert response.status_code in (200, 201), response.content
        task_id = answer["task_id"]
        assert service.get_task(task_id) is not None
        assert client.get(f"{API}{task_id}/").status_code == 200


def body_with(field: str, raw_value: str) -> bytes:
    """A submit body whose ``field`` is the JSON text ``raw_value`` (task_name valid otherwise)."""
    rest = {} if field == "task_name" else {"task_name": HOOK}
    text = json.dumps(rest)[:-1] + (", " if rest else "") + f"{json.dumps(field)}: {raw_value}}}"
    return text.encode()


@pytest.fixture
def submitter(client: Any) -> Any:
    return login(client, "view_reliabletask", "add_reliabletask")


@pytest.mark.parametrize("field", SUBMIT_FIELDS)
def test_every_field_with_odd_json_values_is_never_a_5xx(service, submitter, field):
    for value in ODD_VALUES:
        check_submit(service, submitter, body_with(field, json.dumps(value)))
    for raw in RAW_ODD_VALUES:
        check_submit(service, submitter, body_with(field, raw))


JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["\x00", "\ud800", "a b", "default", HOOK, "2030-01-01T00:00:00Z"])
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@settings(
    max_examples=80,
    deadline=None,
    database=None,  # no example files in the worktree; a failure prints its reproduction
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fields=st.dictionaries(st.sampled_from(SUBMIT_FIELDS), JSON_VALUES, max_size=5))
def test_random_submit_bodies_are_never_a_5xx(service, submitter, fields):
    check_submit(service, submitter, json.dumps({"task_name": HOOK, **fields}).encode())


ODD_DEPENDS_ON: list[Any] = [
    {"a": 1},
    {"x": "y"},
    [["a"]],
    [{"a": 1}],
    ("a", ["b"]),
    [1],
    [None],
    [""],
    ["a\x00"],
    ["\ud800"],
    ["a b"],
    ["x" * 300],
    "a",
    b"a",
    5,
]


@pytest.mark.parametrize("depends_on", ODD_DEPENDS_ON, ids=repr)
def test_odd_depends_on_in_python_submits_is_an_invalid_dependency_error(service, depends_on):
    service.submit(HOOK, None, task_id="a")
    request = TaskSubmitRequest(HOOK, task_id="dependent", depends_on=depends_on)
    calls = [
        lambda: service.submit(HOOK, None, task_id="dependent", depends_on=depends_on),
        lambda: service.submit_many([TaskSubmitRequest(HOOK, task_id="first"), request]),
        lambda: service.chain([TaskSubmitRequest(HOOK, task_id="first"), request]),
        lambda: service.submit_batch([request]),
    ]
    for call in calls:
        with pytest.raises(InvalidDependencyError) as raised:
            call()
        assert raised.value.field == "depends_on"
    assert [t.task_id for t in service.list_tasks()] == ["a"]
