"""The HTTP API on every storage: ``tags`` is a submit field like the others (a bad value is
400 naming it and stores nothing), answered in the task, and ``GET tasks/?tag=`` lists the
tasks of a tag newest first, with the other filters of list_tasks."""

from __future__ import annotations

import json

from tests.support.api_support import API, HOOK


def post(client, **fields):
    body = json.dumps({"task_name": HOOK, **fields})
    return client.post(API, body.encode(), content_type="application/json")


def test_tags_are_stored_answered_and_listed_by_tag(service, operator):
    response = post(operator, task_id="a", tags=["import", "customer:42", "import"])
    assert response.status_code == 201, response.content
    assert response.json()["tags"] == ["import", "customer:42"]
    assert post(operator, task_id="b", tags=["import"], queue="q2").status_code == 201
    assert post(operator, task_id="c").json()["tags"] == []
    assert operator.get(f"{API}a/").json()["tags"] == ["import", "customer:42"]
    listed = operator.get(API, {"tag": "import"})
    assert listed.status_code == 200, listed.content
    assert [task["task_id"] for task in listed.json()["tasks"]] == ["b", "a"]
    assert listed.json()["tasks"][1]["tags"] == ["import", "customer:42"]
    by_queue = operator.get(API, {"tag": "import", "queue": "q2"}).json()["tasks"]
    assert [task["task_id"] for task in by_queue] == ["b"]
    paged = operator.get(API, {"tag": "import", "limit": "1", "offset": "1"}).json()["tasks"]
    assert [task["task_id"] for task in paged] == ["a"]
    assert operator.get(API, {"tag": "nothing"}).json() == {"tasks": []}
    assert [t["task_id"] for t in operator.get(API).json()["tasks"]] == ["c", "b", "a"]


def test_bad_tags_are_400_naming_the_field_and_store_nothing(service, operator):
    for tags in ("import", [""], ["x" * 65], [1], [f"t{n}" for n in range(21)]):
        response = post(operator, task_id="bad", tags=tags)
        assert response.status_code == 400, (tags, response.content)
        assert response.json()["field"] == "tags"
    assert service.get_task("bad") is None


def test_bad_list_queries_are_400_naming_the_parameter(service, operator):
    for query, field in (
        ({"tags": "x"}, "tags"),
        ({"status": "NOPE"}, "status"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "1001"}, "limit"),
    ):
        response = operator.get(API, query)
        assert response.status_code == 400, (query, response.content)
        assert response.json()["field"] == field
