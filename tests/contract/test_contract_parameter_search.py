"""``list_tasks(parameter=...)``: the tasks whose parameter is a JSON object holding every
(key, value) pair, values compared as JSON values (42 is not "42", true is not 1), newest first,
with every other filter; bad filters are refused with a ValueError naming what is wrong."""

from __future__ import annotations

import dataclasses

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.parameter_filter import cut_short
from django_reliable_executor.storage.database import parameter_search
from django_reliable_executor.storage.redis import listing
from tests.conftest import db_params
from tests.support.contract_support import claim_one, run_claim

PARAMETERS = {
    "int": {"customer_id": 42, "region": "eu"},
    "float": {"customer_id": 42.0, "region": "us"},
    "text": {"customer_id": "42", "region": "eu"},
    "bool": {"customer_id": True, "flag": True},
    "one": {"customer_id": 1, "flag": False, "note": None},
    "nested": {"customer_id": [42], "address": {"city": "Edinburgh"}},
    "list": [{"customer_id": 42}],
    "number": 42,
    "none": None,
    "unicode": {"city": 'Zürich "Old" Town', "a.b": "dotted", 'say "hi"': 1, "customer_id": 7},
}


def ids(tasks) -> list[str]:
    return [task.task_id for task in tasks]


@pytest.fixture
def stored(executor, clock):
    """Two tasks per PARAMETERS entry: all of one submit_many first, then each on its own, a
    second apart."""
    executor.submit_many(
        [TaskSubmitRequest("demo.echo", value, task_id=key) for key, value in PARAMETERS.items()]
    )
    clock.advance(1)
    for key, value in PARAMETERS.items():
        executor.submit("demo.echo", value, task_id=key + "-later")
        clock.advance(1)
    return executor


def test_values_compare_as_json_values(stored):
    find = stored.list_tasks
    assert sorted(ids(find(parameter={"customer_id": 42}))) == [
        "float",
        "float-later",
        "int",
        "int-later",
    ]
    assert sorted(ids(find(parameter={"customer_id": "42"}))) == ["text", "text-later"]
    assert sorted(ids(find(parameter={"customer_id": True}))) == ["bool", "bool-later"]
    assert sorted(ids(find(parameter={"customer_id": 1}))) == ["one", "one-later"]
    assert sorted(ids(find(parameter={"flag": False}))) == ["one", "one-later"]
    assert sorted(ids(find(parameter={"note": None}))) == ["one", "one-later"]
    assert find(parameter={"missing": None}) == []  # an absent key is not null
    assert sorted(ids(find(parameter={"city": 'Zürich "Old" Town'}))) == [
        "unicode",
        "unicode-later",
    ]
    assert sorted(ids(find(parameter={"a.b": "dotted"}))) == ["unicode", "unicode-later"]
    assert sorted(ids(find(parameter={'say "hi"': 1}))) == ["unicode", "unicode-later"]
    assert find(parameter={'say "hi"': "1"}) == []
    assert find(parameter={"city": 'zürich "old" town'}) == []  # strings compare exactly


def test_every_pair_must_match_and_newest_come_first(stored):
    find = stored.list_tasks
    assert ids(find(parameter={"customer_id": 42, "region": "eu"})) == ["int-later", "int"]
    assert find(parameter={"customer_id": 42, "region": "mars"}) == []
    assert ids(find(parameter={"region": "eu"})) == ["text-later", "int-later", "text", "int"]
    assert ids(find(parameter={"region": "eu"}, limit=2, offset=1)) == ["int-later", "text"]


def test_combines_with_the_other_filters(stored, storage, clock):
    executor = stored
    executor.submit(
        "demo.cpu", {"customer_id": 42, "iterations": 1}, task_id="other", queue="second"
    )
    executor.submit("demo.echo", {"customer_id": 42}, task_id="tagged", tags=["import"])
    wanted = {"customer_id": 42}
    assert ids(executor.list_tasks(parameter=wanted, task_name="demo.cpu")) == ["other"]
    assert ids(executor.list_tasks(parameter=wanted, queue="second")) == ["other"]
    assert ids(executor.list_tasks(parameter=wanted, tag="import")) == ["tagged"]
    assert executor.list_tasks(parameter={"customer_id": 7}, tag="import") == []
    assert run_claim(executor, claim_one(storage, queue="second")) is TaskStatus.COMPLETED
    assert ids(executor.list_tasks(parameter=wanted, status="COMPLETED")) == ["other"]
    assert "other" not in ids(executor.list_tasks(parameter=wanted, status="CREATED"))
    assert ids(executor.list_tasks(parameter=wanted, statuses=["COMPLETED", "FAILED"])) == ["other"]


def test_a_dataclass_parameter_is_found_by_its_fields(executor):
    @dataclasses.dataclass
    class Order:
        customer_id: int
        city: str

    executor.submit("demo.echo", Order(42, "Edinburgh"), task_id="order")
    executor.submit("demo.echo", Order(43, "Edinburgh"), task_id="other-order")
    assert ids(executor.list_tasks(parameter={"customer_id": 42})) == ["order"]
    found = executor.list_tasks(parameter={"city": "Edinburgh"})
    assert sorted(ids(found)) == ["order", "other-order"]
    assert not cut_short(found)


@pytest.mark.parametrize(
    ("parameter", "message"),
    [
        ([("customer_id", 42)], "parameter must be a dict of top-level keys and values, got list"),
        ({}, "parameter must name at least one key"),
        ({5: 1}, "parameter's keys must be non-empty strings, got 5"),
        ({"": 1}, "parameter's keys must be non-empty strings, got ''"),
        ({"address": {"city": "x"}}, r"parameter\['address'\] is a dict: only a string, a number"),
        ({"ids": [42]}, r"parameter\['ids'\] is a list"),
        ({"x": float("nan")}, r"parameter\['x'\] is nan: JSON has no such number"),
        ({"x": object()}, r"parameter\['x'\] is a object"),
        ({f"k{i}": i for i in range(21)}, "parameter names 21 keys, over the 20 allowed"),
        ({"x": 10**5000}, r"parameter\['x'\] is an integer of too many digits to search for"),
    ],
)
def test_a_bad_filter_is_refused_naming_what_is_wrong(seeded, parameter, message):
    with pytest.raises(ValueError, match=message):
        seeded.list_tasks(parameter=parameter)
    assert ids(seeded.list_tasks()) == ["existing"]


def test_integers_past_64_bits_are_searched_for(executor):
    executor.submit("demo.echo", {"big": 2**64, "small": -(2**63) - 1}, task_id="big")
    executor.submit("demo.echo", {"big": 2**63 - 1}, task_id="int64")
    assert ids(executor.list_tasks(parameter={"big": 2**64})) == ["big"]
    assert ids(executor.list_tasks(parameter={"small": -(2**63) - 1})) == ["big"]
    assert ids(executor.list_tasks(parameter={"big": 2**63 - 1})) == ["int64"]


def test_text_no_storage_holds_matches_nothing(seeded):
    assert seeded.list_tasks(parameter={"keep\x00": True}) == []
    assert seeded.list_tasks(parameter={"keep": "\ud800"}) == []
    assert ids(seeded.list_tasks(parameter={"keep": True})) == ["existing"]


@pytest.mark.parametrize("alias", db_params(["redis"]), indirect=True)
def test_redis_stops_reading_at_its_bound_and_says_so(executor, clock, monkeypatch):
    monkeypatch.setattr(listing, "SCAN_LIMIT", 1000)  # 20 000 in use: 1 500 tasks show it
    executor.submit("demo.echo", {"customer_id": 42}, task_id="oldest", tags=["t"])
    clock.advance(1)
    requests = [TaskSubmitRequest("demo.echo", {"n": n}, tags=("t",)) for n in range(1500)]
    executor.submit_many(requests)
    page = executor.list_tasks(tag="t", parameter={"customer_id": 42})
    assert page == [] and cut_short(page)  # the match lies beyond the 1 000 newest
    page = executor.list_tasks(tag="t", parameter={"n": 1499})
    assert len(page) == 1 and cut_short(page)  # found, but older ones were not read
    page = executor.list_tasks(tag="t", parameter={"n": 1499}, limit=1)
    assert len(page) == 1 and not cut_short(page)  # the page was full before the bound
    monkeypatch.setattr(listing, "SCAN_LIMIT", 2000)
    page = executor.list_tasks(tag="t", parameter={"customer_id": 42})
    assert ids(page) == ["oldest"] and not cut_short(page)


@pytest.mark.parametrize("alias", db_params(["mariadb"]), indirect=True)
def test_mariadb_checks_the_newest_first_then_reads_the_table_once(executor, clock, monkeypatch):
    monkeypatch.setattr(parameter_search, "PROBE", 3)
    for n in range(6):
        executor.submit("demo.echo", {"n": n, "even": n % 2 == 0}, task_id=f"t{n}", tags=["all"])
        clock.advance(1)
    # the newest 3 hold the page: t5, t3 (limit 2)
    assert ids(executor.list_tasks(parameter={"even": False}, limit=2)) == ["t5", "t3"]
    # they do not: the whole table is read (without index), then sorted
    assert ids(executor.list_tasks(parameter={"even": True})) == ["t4", "t2", "t0"]
    assert ids(executor.list_tasks(parameter={"n": 0})) == ["t0"]
    assert ids(executor.list_tasks(parameter={"even": True}, offset=1, limit=1)) == ["t2"]
    assert ids(executor.list_tasks(parameter={"n": 0}, tag="all")) == ["t0"]  # by the tag
    assert ids(executor.list_tasks(parameter={"even": True}, status="CREATED")) == [
        "t4",
        "t2",
        "t0",
    ]
