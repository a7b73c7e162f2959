"""``list_tasks(parameter=...)`` compares numbers exactly on every storage, with and without
the parameter index: 64-bit ids past 2**53 (which no double tells from their neighbours),
negative ones, and floats near an integer or near zero; 42 and 42.0 find each other."""

from __future__ import annotations

import dataclasses

import pytest

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.conf import get_settings
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.contract.test_contract_parameter_search import ids

BIG = 2**53
PARAMETERS = {
    "above": {"id": BIG + 1},
    "at": {"id": BIG},
    "above-neg": {"id": -(BIG + 1)},
    "at-neg": {"id": -BIG},
    "max": {"id": 2**63 - 1},  # as a double: 2**63
    "max-near": {"id": 2**63 - 2},
    "min": {"id": -(2**63)},
    "double": {"id": float(2**60)},  # stored as 1.152921504606847e+18: exactly 2**60
    "next": {"id": 2**60 + 1},
    "answer": {"x": 42},
    "answer-float": {"x": 42.0},
    "near-answer": {"x": 42.0000000000001},
    "zero": {"x": 0},
    "tiny": {"x": 1e-13},
    "tenth": {"x": 0.1},
    "big-text": {"id": str(BIG + 1)},
}
# (search, the tasks it finds)
SEARCHES = [
    ({"id": BIG + 1}, ["above"]),
    ({"id": BIG}, ["at"]),
    ({"id": float(BIG)}, ["at"]),
    ({"id": BIG - 1}, []),
    ({"id": -(BIG + 1)}, ["above-neg"]),
    ({"id": -BIG}, ["at-neg"]),
    ({"id": -float(BIG)}, ["at-neg"]),
    ({"id": 2**63 - 1}, ["max"]),
    ({"id": 2**63 - 2}, ["max-near"]),
    ({"id": float(2**63)}, []),  # the double both round to: neither is it
    ({"id": -(2**63)}, ["min"]),
    ({"id": -float(2**63)}, ["min"]),
    ({"id": 2**60}, ["double"]),
    ({"id": float(2**60)}, ["double"]),
    ({"id": 2**60 + 1}, ["next"]),
    ({"id": str(BIG + 1)}, ["big-text"]),
    ({"x": 42}, ["answer", "answer-float"]),
    ({"x": 42.0}, ["answer", "answer-float"]),
    ({"x": 42.0000000000001}, ["near-answer"]),
    ({"x": 0}, ["zero"]),
    ({"x": 0.0}, ["zero"]),
    ({"x": 1e-13}, ["tiny"]),
    ({"x": 0.1}, ["tenth"]),
    ({"x": 0.1 + 1e-13}, []),
]


@pytest.fixture
def services(storage, clock) -> tuple[ReliableExecutor, ReliableExecutor]:
    """A service searching ``id`` and ``x`` through the index, and one without it, over the
    same storage holding one task per PARAMETERS entry (submitted by the first, so both
    answer)."""
    settings = get_settings()
    indexed = ReliableExecutor(
        storage,
        clock=clock,
        settings=dataclasses.replace(settings, SEARCHABLE_PARAMETERS=("id", "x")),
    )
    plain = ReliableExecutor(
        storage, clock=clock, settings=dataclasses.replace(settings, SEARCHABLE_PARAMETERS=())
    )
    indexed.submit_many(
        [TaskSubmitRequest("demo.echo", value, task_id=key) for key, value in PARAMETERS.items()]
    )
    return indexed, plain


@pytest.mark.parametrize("searching", ["indexed", "plain"])
def test_numbers_are_compared_exactly(services, searching):
    service = services[0] if searching == "indexed" else services[1]
    for parameter, expected in SEARCHES:
        found = sorted(ids(service.list_tasks(parameter=parameter)))
        assert found == expected, parameter


def test_every_pair_of_big_numbers_must_match(executor):
    executor.submit("demo.echo", {"a": BIG + 1, "b": -(BIG + 1)}, task_id="both")
    executor.submit("demo.echo", {"a": BIG + 1, "b": -BIG}, task_id="one")
    assert ids(executor.list_tasks(parameter={"a": BIG + 1, "b": -(BIG + 1)})) == ["both"]
    assert ids(executor.list_tasks(parameter={"a": BIG + 1, "b": -BIG})) == ["one"]
    assert executor.list_tasks(parameter={"a": BIG, "b": -BIG}) == []


def test_integers_past_64_bits_and_past_doubles_are_compared_exactly(executor):
    """Past 2**63 SQLite reads a JSON integer as a real, and past 1.8e308 no double holds it."""
    executor.submit("demo.echo", {"a": 2**64 + 1, "b": -(2**64 + 1)}, task_id="past-64")
    executor.submit("demo.echo", {"a": 10**30 + 1, "b": 10**400}, task_id="past-doubles")
    executor.submit("demo.echo", {"a": 2**64, "b": 1e20}, task_id="exact")
    find = executor.list_tasks
    assert ids(find(parameter={"a": 2**64 + 1})) == ["past-64"]
    assert ids(find(parameter={"b": -(2**64 + 1)})) == ["past-64"]
    assert find(parameter={"b": -(2**64)}) == []
    assert ids(find(parameter={"a": 2**64})) == ["exact"]
    assert ids(find(parameter={"a": float(2**64)})) == ["exact"]
    assert ids(find(parameter={"a": 10**30 + 1})) == ["past-doubles"]
    assert find(parameter={"a": 10**30}) == []
    assert ids(find(parameter={"b": 10**400})) == ["past-doubles"]
    assert find(parameter={"b": 10**400 + 1}) == []
    assert ids(find(parameter={"b": 10**20})) == ["exact"]  # 1e20 is exactly 10**20
    assert find(parameter={"b": 10**20 + 1}) == []


def test_a_key_holding_a_quote_finds_integers_past_doubles(executor):
    executor.submit("demo.echo", {'say "id"': 10**400}, task_id="huge")
    assert ids(executor.list_tasks(parameter={'say "id"': 10**400})) == ["huge"]
    assert executor.list_tasks(parameter={'say "id"': -(10**400)}) == []
