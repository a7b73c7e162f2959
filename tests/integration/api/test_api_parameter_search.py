"""The HTTP API on every storage: ``GET tasks/?parameter={"customer_id": 42}`` lists the tasks
whose parameter holds those top-level values (compared as JSON values) newest first, with the
other filters; a filter that is not a JSON object of scalars is a 400 naming ``parameter``."""

from __future__ import annotations

import json

from tests.support.api_support import API, HOOK


def post(client, **fields):
    body = json.dumps({"task_name": HOOK, **fields})
    response = client.post(API, body.encode(), content_type="application/json")
    assert response.status_code == 201, response.content


def listed(client, **query) -> list[str]:
    response = client.get(API, query)
    assert response.status_code == 200, response.content
    assert response.json()["cut_short"] is False  # every task read: a complete answer
    return [task["task_id"] for task in response.json()["tasks"]]


def test_tasks_are_listed_by_parameter_with_the_other_filters(service, operator):
    post(operator, task_id="a", task_parameter={"customer_id": 42, "region": "eu"})
    post(operator, task_id="b", task_parameter={"customer_id": 42}, tags=["import"], queue="q2")
    post(operator, task_id="c", task_parameter={"customer_id": "42"})
    post(operator, task_id="d", task_parameter=[{"customer_id": 42}])
    wanted = json.dumps({"customer_id": 42})
    assert listed(operator, parameter=wanted) == ["b", "a"]
    assert listed(operator, parameter='{"customer_id": "42"}') == ["c"]
    assert listed(operator, parameter='{"customer_id": 42, "region": "eu"}') == ["a"]
    assert listed(operator, parameter=wanted, tag="import") == ["b"]
    assert listed(operator, parameter=wanted, queue="q2") == ["b"]
    assert listed(operator, parameter=wanted, status="FAILED") == []
    assert listed(operator, parameter=wanted, limit="1", offset="1") == ["a"]
    assert "cut_short" not in operator.get(API).json()  # only a parameter search says it


def test_a_bad_parameter_filter_is_400_naming_it(service, operator):
    for text, message in (
        ("{not json", 'parameter must be a JSON object such as {"customer_id": 42}'),
        ("[42]", "parameter must be a dict of top-level keys and values, got list"),
        ("{}", "parameter must name at least one key"),
        ('{"address": {"city": "x"}}', "parameter['address'] is a dict"),
    ):
        response = operator.get(API, {"parameter": text})
        assert response.status_code == 400, (text, response.content)
        assert response.json()["field"] == "parameter"
        assert message in response.json()["error"], response.json()
    response = operator.get(f"{API}?parameter=%7B%22a%22%3A1%7D&parameter=%7B%7D")
    assert response.status_code == 400
    assert response.json()["field"] == "parameter"
