"""The task list's search box read as filters on every storage: ``tag:import customer_id=42
region=eu`` becomes the list's tag and parameter filters (the other filters kept), the box shows
them again, and a term it cannot read is named in a message with the list left as it was."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from django_reliable_executor.admin import parameter_search
from tests.support.admin_support import LIST_URL, detail_url, message_texts


def listed(response: Any) -> list[str]:
    return [row.task.task_id for row in response.context["rows"]]


def followed(client: Any, search: str, **filters: str) -> Any:
    """The list page a search box text leads to (its redirect followed)."""
    response = client.get(LIST_URL, {"q": search, **filters})
    assert response.status_code == 302, message_texts(response)
    return client.get(response["Location"])


@pytest.fixture
def customers(service):
    service.submit("demo.echo", {"customer_id": 42, "region": "eu"}, task_id="c42-eu")
    service.submit(
        "demo.echo", {"customer_id": 42, "region": "us"}, task_id="c42-us", tags=["import"]
    )
    service.submit("demo.echo", {"customer_id": "42", "region": "eu"}, task_id="c42-text")
    service.submit(
        "demo.echo",
        {"customer_id": 42, "city": "New York"},
        task_id="c42-ny",
        tags=["import"],
        queue="emails",
    )
    service.submit(
        "demo.echo", {"customer_id": 7, "city": "Edinburgh"}, task_id="c7", tags=["import"]
    )
    return service


def test_terms_filter_the_list_by_parameter_tag_and_other_filters(customers, viewer):
    response = viewer.get(LIST_URL, {"q": "customer_id=42 region=eu", "queue": "default"})
    assert response.status_code == 302
    query = parse_qs(urlsplit(response["Location"]).query)
    assert query == {"queue": ["default"], "parameter": ['{"customer_id":42,"region":"eu"}']}
    page = viewer.get(response["Location"])
    assert listed(page) == ["c42-eu"]  # not the "42" string's task, nor another region's
    assert page.context["search"] == "customer_id=42 region=eu"  # the box shows the filters
    assert page.context["total"] is None  # no counter counts by parameter
    assert listed(followed(viewer, "customer_id=42")) == ["c42-ny", "c42-us", "c42-eu"]
    assert listed(followed(viewer, 'customer_id="42"')) == ["c42-text"]
    assert listed(followed(viewer, "city=Edinburgh")) == ["c7"]
    assert listed(followed(viewer, 'city="New York"')) == ["c42-ny"]
    assert listed(followed(viewer, "customer_id=43")) == []
    # with a tag and the other filters
    page = followed(viewer, "tag:import customer_id=42")
    assert listed(page) == ["c42-ny", "c42-us"]
    assert page.context["search"] == "tag:import customer_id=42"
    assert 'value="tag:import customer_id=42"' in page.content.decode()
    assert listed(followed(viewer, "customer_id=42 tag:import", queue="emails")) == ["c42-ny"]
    assert listed(followed(viewer, "tag:import customer_id=42", status="FAILED")) == []
    # the populated tasks' parameters are found too ({"order": 2}: the two failed ones)
    assert listed(followed(viewer, "order=2")) == ["t-failed-emails", "t-failed"]
    # the box emptied of its terms drops both filters
    response = viewer.get(LIST_URL, {"q": "tag:", "tag": "import", "parameter": '{"a":1}'})
    assert response["Location"] == LIST_URL + "?"


BAD_TERMS = [
    ("customer_id=42 oops", "Could not read 'oops': search terms are tag:NAME and key=value"),
    ("=42", "Could not read '=42'"),
    ("customer_id=", "'customer_id=' has no value: write customer_id=\"\" for an empty string."),
    ("a=1 a=2", "'a' is given twice."),
    ("tag:a tag:b", "One tag at a time: 'tag:b' is a second one."),
    ('address={"city":"x"}', "Could not search by parameter['address'] is a dict"),
]


def test_a_bad_term_or_url_is_named_and_the_list_left_as_it_was(customers, viewer):
    for search, message in BAD_TERMS:
        response = viewer.get(LIST_URL, {"q": search, "tag": "import"})
        assert response.status_code == 200
        [text] = message_texts(response)
        assert text.startswith(message), search
        assert listed(response) == ["c7", "c42-ny", "c42-us"]  # still the tag's list
        assert response.context["search"] == search  # the text kept, to be corrected
    response = viewer.get(LIST_URL, {"parameter": "{not json", "tag": "import"})
    [text] = message_texts(response)
    assert text.startswith("The list's parameter filter '{not json' is not one")
    assert listed(response) == ["c7", "c42-ny", "c42-us"]
    response = viewer.get(LIST_URL, {"parameter": "[42]"})
    assert "parameter must be a dict" in message_texts(response)[0]
    # a task id holding "=" still opens its task
    customers.submit("demo.echo", None, task_id="order=7")
    response = viewer.get(LIST_URL, {"q": "order=7"})
    assert response.status_code == 302
    assert response["Location"] == detail_url("order=7")


def test_values_read_as_json_when_they_are_json():
    parse = parameter_search.parse
    assert parse('n=42 f=4.5 t=true z=null s=Edinburgh q="42"').parameter == {
        "n": 42,
        "f": 4.5,
        "t": True,
        "z": None,
        "s": "Edinburgh",
        "q": "42",
    }
    text = parameter_search.filters_text(
        "import", json.dumps({"n": 42, "q": "42", "s": "Edinburgh", "c": "New York"})
    )
    assert text == 'tag:import n=42 q="42" s=Edinburgh c="New York"'
    assert parse(text).parameter == {"n": 42, "q": "42", "s": "Edinburgh", "c": "New York"}
