"""``list_tasks(parameter=...)`` under SEARCHABLE_PARAMETERS on every storage: a search naming a
searchable key reads the parameter index, and answers what the same search answers without it
(42 and 42.0 alike, never "42" nor true; long values; keys holding ':' or not ASCII; with
the other filters and offsets), never cut short."""

from __future__ import annotations

import dataclasses

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.conf import get_settings
from django_reliable_executor.core.parameter_filter import cut_short
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.contract.test_contract_parameter_search import PARAMETERS, ids
from tests.support.contract_support import LEASE

KEYS = ["customer_id", "region", "flag", "note", "city", "a:b", "ключ", "long"]
LONG = "é" * 150  # over 200 characters as JSON text: indexed as a digest
MORE = {
    "colon": {"a:b": "c", "ключ": "значение", "customer_id": 42},
    "long": {"long": LONG, "customer_id": 7},
    "longer": {"long": LONG + "!", "customer_id": 7},
}
SEARCHES = [
    {"parameter": {"customer_id": 42}},
    {"parameter": {"customer_id": 42.0}},
    {"parameter": {"customer_id": "42"}},
    {"parameter": {"customer_id": True}},
    {"parameter": {"note": None}},
    {"parameter": {"customer_id": 42, "region": "eu"}},
    {"parameter": {"region": "eu"}, "limit": 2, "offset": 1},
    {"parameter": {"city": 'Zürich "Old" Town', "customer_id": 7}},
    {"parameter": {"a:b": "c", "ключ": "значение"}},
    {"parameter": {"long": LONG}},
    {"parameter": {"customer_id": 42}, "tag": "t"},
    {"parameter": {"customer_id": 42}, "status": "RUNNING"},
    {"parameter": {"customer_id": 42}, "statuses": ["CREATED"], "offset": 1},
    {"parameter": {"customer_id": 42}, "task_name": "demo.echo", "limit": 1},
    {"parameter": {"customer_id": 42, "unindexed": None}},
]


def test_the_index_answers_what_the_search_without_it_answers(settings, storage, clock):
    settings.RELIABLE_EXECUTOR = {**settings.RELIABLE_EXECUTOR, "SEARCHABLE_PARAMETERS": KEYS}
    indexed = ReliableExecutor(storage, clock=clock)
    plain = ReliableExecutor(
        storage, clock=clock, settings=dataclasses.replace(get_settings(), SEARCHABLE_PARAMETERS=())
    )
    everything = {**PARAMETERS, **MORE}
    indexed.submit_many(
        [TaskSubmitRequest("demo.echo", value, task_id=key) for key, value in everything.items()]
    )
    for key, value in everything.items():
        clock.advance(1)
        indexed.submit("demo.echo", value, task_id=key + "-later", tags=["t"])
    [claim] = storage.claim("w1", ["default"], 1, LEASE)  # "int", the oldest
    assert storage.start(claim, LEASE) is not None  # RUNNING
    for search in SEARCHES:
        found = indexed.list_tasks(**search)
        assert ids(found) == ids(plain.list_tasks(**search)), search
        assert not cut_short(found), search
    assert ids(indexed.list_tasks(parameter={"customer_id": 42.0}, limit=4)) == [
        "colon-later",
        "float-later",
        "int-later",
        "colon",
    ]
    assert ids(indexed.list_tasks(parameter={"long": LONG})) == ["long-later", "long"]
