"""The HTTP API on every storage: a submit whose text no storage can hold (a NUL, a lone
surrogate, as JSON escapes) is 400 naming the field, and stores nothing."""

from __future__ import annotations

import pytest

from tests.support.api_support import API, HOOK


@pytest.mark.parametrize("escape", ["\\u0000", "\\udc80"], ids=["nul", "surrogate"])
@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ('"queue": "q{}"', "queue"),
        ('"rate_key": "k{}"', "rate_key"),
        ('"unique_for": 60, "unique_key": "k{}"', "unique_key"),
        ('"task_id": "t{}"', "task_id"),
        ('"depends_on": ["d{}"]', "depends_on"),
        ('"task_parameter": {"note": "a{}"}', "task_parameter"),
        ('"task_parameter": {"a{}": 1}', "task_parameter"),
    ],
    ids=["queue", "rate_key", "unique_key", "task_id", "depends_on", "value", "key"],
)
def test_a_submit_with_text_no_storage_can_hold_is_400_and_stores_nothing(
    service, operator, fields, field, escape
):
    body = f'{{"task_name": "{HOOK}", {fields.replace("{}", escape)}}}'
    response = operator.post(API, body.encode(), content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert service.list_tasks() == []


@pytest.mark.parametrize(
    ("method", "path"), [("get", "a%00b/"), ("post", "a%00b/cancel/"), ("post", "a%00b/retry/")]
)
def test_a_task_id_with_a_nul_in_the_path_is_404(service, operator, method, path):
    service.submit(HOOK, None, task_id="ab")
    response = getattr(operator, method)(API + path)
    assert response.status_code == 404, response.content
    assert response.json()["field"] == "task_id"
    assert [task.task_id for task in service.list_tasks()] == ["ab"]
