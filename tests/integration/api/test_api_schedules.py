"""The schedule endpoints of the HTTP API on every storage (SQLite, MariaDB, PostgreSQL, Redis):
define/redefine, get, list, pause, resume and delete over signed requests and staff sessions,
each endpoint's permission, replays, bad input, unknown ids and wrong methods."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client, override_settings

from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import ADMIN_APPS
from tests.support.api_support import (
    HOOK,
    KEY_ID,
    SECRET,
    login,
    post_json,
    rejected,
    signed_get,
    signed_headers,
    signed_post,
)

API = "/executor/api/schedules/"
UTC = dt.timezone.utc
PERM = "django_reliable_executor.{}_reliableschedule"


def signed_delete(client: Client, path: str, **kwargs: Any) -> Any:
    return client.delete(path, headers=signed_headers("DELETE", path, **kwargs))


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [s["schedule_id"] for s in response.json()["schedules"]]


def when(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value) if value is not None else None


def nothing_stored(service: ReliableExecutor) -> bool:
    return service.list_schedules() == [] and service.count_schedules() == {
        "active": 0,
        "paused": 0,
    }


# -- happy paths -------------------------------------------------------------------------------
def test_define_get_list_pause_resume_delete_signed(service):
    client = Client(enforce_csrf_checks=True)  # signed requests are CSRF-exempt
    response = signed_post(
        client,
        API,
        {
            "schedule_id": "every5",
            "task_name": HOOK,
            "parameter": {"n": 1},
            "every": 300,
            "queue": "mail",
            "priority": 2,
            "retry_limit": 1,
        },
    )
    assert response.status_code == 201, response.content
    first = response.json()
    assert set(first) == {
        "schedule_id", "task_name", "parameter", "every", "cron", "timezone", "start_at",
        "misfire", "queue", "priority", "retry_limit", "retry_interval", "retry_backoff",
        "max_duration_millis", "paused", "next_run_at", "last_run_at", "last_task_id", "origin",
        "created_at", "updated_at", "description", "overlap", "overlap_skipped",
        "last_skipped_at",
    }  # fmt: skip
    assert (first["schedule_id"], first["task_name"], first["parameter"]) == (
        "every5",
        HOOK,
        {"n": 1},
    )
    assert first["every"] == 300 and first["cron"] is None and first["timezone"] == "UTC"
    assert (first["queue"], first["priority"], first["retry_limit"]) == ("mail", 2, 1)
    assert first["retry_interval"] == 1000  # the handler's, resolved when saved
    assert first["retry_backoff"] == "fixed" and first["max_duration_millis"] is None
    assert first["misfire"] == "skip" and first["paused"] is False and first["origin"] == "api"
    assert first["overlap"] == "allow" and first["overlap_skipped"] == 0
    assert first["last_skipped_at"] is None
    assert first["last_run_at"] is None and first["last_task_id"] is None
    assert first["description"] == "every 5 minutes"
    created = when(first["created_at"])
    assert created.utcoffset() == dt.timedelta(0) and first["updated_at"] == first["created_at"]
    # One interval after creation (Redis stamps created_at with its own clock: a hair apart).
    late = when(first["next_run_at"]) - created - dt.timedelta(minutes=5)
    assert abs(late) < dt.timedelta(seconds=1)
    stored = service.get_schedule("every5")
    assert stored.every == dt.timedelta(minutes=5) and stored.parameter == {"n": 1}

    # The same id again redefines it: 200, the creation time kept.
    again = signed_post(
        client,
        API,
        {"schedule_id": "every5", "task_name": HOOK, "parameter": {"n": 2}, "every": 300},
    )
    assert again.status_code == 200, again.content
    assert again.json()["parameter"] == {"n": 2} and again.json()["queue"] == "default"
    assert again.json()["created_at"] == first["created_at"]
    assert again.json()["next_run_at"] == first["next_run_at"]  # same timing, same next run

    start = dt.datetime(2031, 5, 1, 8, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    cron = signed_post(
        client,
        API,
        {
            "schedule_id": "nightly/report",
            "task_name": HOOK,
            "cron": "0 3 * * *",
            "timezone": "Europe/Paris",
            "start_at": start.isoformat(),
            "misfire": "run_once",
            "overlap": "skip",
            "max_duration_millis": 60_000,
            "every": None,
        },
    )
    assert cron.status_code == 201, cron.content
    nightly = cron.json()
    assert nightly["every"] is None and nightly["cron"] == "0 3 * * *"
    assert nightly["description"] == "cron 0 3 * * * (Europe/Paris)"
    assert nightly["start_at"] == "2031-05-01T06:00:00+00:00"  # in UTC
    # 03:00 in Paris (UTC+2 in summer) after the start: 01:00 UTC the next day.
    assert nightly["next_run_at"] == "2031-05-02T01:00:00+00:00"
    assert nightly["misfire"] == "run_once" and nightly["max_duration_millis"] == 60_000
    assert nightly["overlap"] == "skip"

    assert signed_get(client, f"{API}nightly/report/").json() == nightly
    listed = signed_get(client, API)
    assert ids(listed) == ["every5", "nightly/report"]
    assert listed.json()["schedules"][1] == nightly
    assert listed.json()["counts"] == {"active": 2, "paused": 0}

    paused = signed_post(client, f"{API}every5/pause/")
    assert paused.status_code == 200 and paused.json()["paused"] is True
    assert service.get_schedule("every5").paused
    assert signed_post(client, f"{API}every5/pause/").json()["paused"] is True  # idempotent
    assert ids(signed_get(client, f"{API}?paused=true")) == ["every5"]
    assert ids(signed_get(client, f"{API}?paused=false")) == ["nightly/report"]
    assert signed_get(client, API).json()["counts"] == {"active": 1, "paused": 1}
    resumed = signed_post(client, f"{API}every5/resume/")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False
    assert not service.get_schedule("every5").paused

    deleted = signed_delete(client, f"{API}every5/")
    assert deleted.status_code == 200
    assert deleted.json() == {"deleted": True, "schedule_id": "every5"}
    assert signed_get(client, f"{API}every5/").status_code == 404
    deleted = signed_post(client, f"{API}nightly/report/delete/")
    assert deleted.json() == {"deleted": True, "schedule_id": "nightly/report"}
    assert nothing_stored(service)


def test_list_pages_by_id(service, client):
    for name in ("c", "a", "d", "b"):
        service.schedule(name, HOOK, every=60)
    service.pause_schedule("d")
    login(client, "view_reliableschedule")
    assert ids(client.get(API)) == ["a", "b", "c", "d"]
    assert ids(client.get(f"{API}?limit=2")) == ["a", "b"]
    assert ids(client.get(f"{API}?limit=2&offset=1")) == ["b", "c"]
    assert ids(client.get(f"{API}?offset=3")) == ["d"]
    assert ids(client.get(f"{API}?limit=0")) == []
    assert ids(client.get(f"{API}?offset=2&paused=false")) == ["c"]
    assert client.get(f"{API}?limit=2").json()["counts"] == {"active": 3, "paused": 1}


def test_the_json_of_a_schedule_that_has_fired(service):
    import dataclasses

    from django_reliable_executor.api.schedules import schedule_json

    info = service.schedule("f", HOOK, every=90.5, timezone="Asia/Tokyo")
    last = dt.datetime(2031, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=9)))
    data = schedule_json(dataclasses.replace(info, last_run_at=last, last_task_id="f@x"))
    assert data["every"] == 90.5 and data["timezone"] == "Asia/Tokyo"
    assert data["last_run_at"] == "2031-01-01T18:04:05.000006+00:00"  # in UTC
    assert data["last_task_id"] == "f@x"
    assert data["description"] == info.describe()
    json.dumps(data)  # JSON as it is


# -- sessions: CSRF ---------------------------------------------------------------------------
@pytest.fixture
def operator_of_schedules(client: Client) -> Client:
    return login(
        client,
        "view_reliableschedule",
        "add_reliableschedule",
        "change_reliableschedule",
        "delete_reliableschedule",
    )


def forbidden(response: Any, permission: str) -> None:
    assert response.status_code == 403, response.content
    assert PERM.format(permission) in response.json()["error"]


def test_session_posts_and_deletes_need_the_csrf_token(service):
    client = login(
        Client(enforce_csrf_checks=True),
        "add_reliableschedule",
        "change_reliableschedule",
        "delete_reliableschedule",
    )
    definition = {"schedule_id": "c1", "task_name": HOOK, "every": 60}
    response = post_json(client, API, definition)
    assert response.status_code == 403 and "CSRF" in response.json()["error"]
    assert nothing_stored(service)
    service.schedule("c1", HOOK, every=60)
    for response in (
        post_json(client, f"{API}c1/pause/"),
        client.delete(f"{API}c1/"),
        post_json(client, f"{API}c1/delete/"),
    ):
        assert response.status_code == 403 and "CSRF" in response.json()["error"]
    assert service.get_schedule("c1") is not None and not service.get_schedule("c1").paused
    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    assert post_json(client, f"{API}c1/pause/", X_CSRFToken=token).json()["paused"] is True
    response = client.delete(f"{API}c1/", headers={"X-CSRFToken": token})
    assert response.status_code == 200
    response = post_json(client, API, definition, X_CSRFToken=token)
    assert response.status_code == 201


# -- signed requests ---------------------------------------------------------------------------
def test_a_replayed_signed_schedule_request_is_401(service, client):
    body = json.dumps({"schedule_id": "n1", "task_name": HOOK, "every": 60}).encode()
    headers = signed_headers("POST", API, body)
    assert post_json(client, API, body, **headers).status_code == 201
    service.delete_schedule("n1")
    rejected(post_json(client, API, body, **headers), "nonce already used")
    assert nothing_stored(service)

    service.schedule("n1", HOOK, every=60)
    headers = signed_headers("POST", f"{API}n1/pause/")
    assert post_json(client, f"{API}n1/pause/", b"", **headers).status_code == 200
    service.resume_schedule("n1")
    rejected(post_json(client, f"{API}n1/pause/", b"", **headers), "nonce already used")
    assert not service.get_schedule("n1").paused

    headers = signed_headers("DELETE", f"{API}n1/")
    assert client.delete(f"{API}n1/", headers=headers).status_code == 200
    service.schedule("n1", HOOK, every=60)
    rejected(client.delete(f"{API}n1/", headers=headers), "nonce already used")
    assert service.get_schedule("n1") is not None


def test_signatures_cover_method_path_query_and_body(service, client):
    body = json.dumps({"schedule_id": "b1", "task_name": HOOK, "every": 60}).encode()
    other = json.dumps({"schedule_id": "b1", "task_name": HOOK, "every": 1}).encode()
    rejected(post_json(client, API, body, **signed_headers("POST", API, other)), "bad signature")
    rejected(
        post_json(client, API, body, **signed_headers("POST", API, body, secret="z" * 40)),
        "bad signature",
    )
    assert nothing_stored(service)
    service.schedule("b1", HOOK, every=60)
    # A signed GET of the schedule is no licence to DELETE it, nor a list to page on.
    headers = signed_headers("GET", f"{API}b1/")
    rejected(client.delete(f"{API}b1/", headers=headers), "bad signature")
    rejected(client.get(f"{API}?paused=true", headers=signed_headers("GET", API)), "bad signature")
    assert service.get_schedule("b1") is not None


# -- bad input ---------------------------------------------------------------------------------
GOOD = {"schedule_id": "bad-1", "task_name": HOOK, "every": 60}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"\xff\xfe", None, "not valid JSON"),
        (b"", None, "not valid JSON"),
        (b'["bad-1"]', None, "JSON object"),
        ({**GOOD, "colour": "red"}, "colour", "unknown field 'colour'"),
        ({**GOOD, "task_parameter": 1}, "task_parameter", "unknown field"),
        ({"task_name": HOOK, "every": 60}, "schedule_id", "required"),
        ({**GOOD, "schedule_id": None}, "schedule_id", "required"),
        ({"schedule_id": "bad-1", "every": 60}, "task_name", "required"),
        ({**GOOD, "schedule_id": 12}, "schedule_id", "must be a string or null, got an integer"),
        ({**GOOD, "schedule_id": "a b"}, "schedule_id", "whitespace"),
        ({**GOOD, "schedule_id": "x" * 161}, "schedule_id", "1..160 characters"),
        ({**GOOD, "task_name": 5}, "task_name", "must be a string"),
        ({**GOOD, "task_name": "no.such.task"}, "task_name", "no registered handler"),
        ({**GOOD, "every": "60"}, "every", "must be a number or null, got a string"),
        ({**GOOD, "every": True}, "every", "must be a number or null, got a boolean"),
        ({**GOOD, "every": [60]}, "every", "got an array"),
        ({**GOOD, "every": 0}, "every", "at least 1 second"),
        ({**GOOD, "every": -5}, "every", "every"),
        ({"schedule_id": "bad-1", "task_name": HOOK}, "every", "exactly one of"),
        ({**GOOD, "cron": "0 3 * * *"}, "every", "exactly one of"),
        ({**GOOD, "every": None, "cron": "61 * * * *"}, "cron", "cron"),
        ({**GOOD, "every": None, "cron": 5}, "cron", "must be a string"),
        ({**GOOD, "timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
        ({**GOOD, "timezone": 1}, "timezone", "must be a string"),
        ({**GOOD, "queue": ""}, "queue", "queue"),
        ({**GOOD, "queue": 3}, "queue", "must be a string"),
        ({**GOOD, "priority": "5"}, "priority", "must be an integer"),
        ({**GOOD, "priority": 1.5}, "priority", "must be an integer or null, got a number"),
        ({**GOOD, "priority": 2**40}, "priority", "32-bit integer"),
        ({**GOOD, "retry_limit": -1}, "retry_limit", "retry_limit"),
        ({**GOOD, "retry_limit": False}, "retry_limit", "got a boolean"),
        ({**GOOD, "retry_interval": "1s"}, "retry_interval", "must be an integer"),
        ({**GOOD, "retry_backoff": "linear"}, "retry_backoff", "retry_backoff"),
        ({**GOOD, "max_duration_millis": 0}, "max_duration_millis", "max_duration_millis"),
        ({**GOOD, "max_duration_millis": {}}, "max_duration_millis", "got an object"),
        ({**GOOD, "misfire": "sometimes"}, "misfire", "misfire must be one of"),
        ({**GOOD, "misfire": 1}, "misfire", "must be a string"),
        ({**GOOD, "overlap": "sometimes"}, "overlap", "overlap must be one of"),
        ({**GOOD, "overlap": True}, "overlap", "must be a string"),
        ({**GOOD, "start_at": "2030-01-01T00:00:00"}, "start_at", "UTC offset"),
        ({**GOOD, "start_at": "tomorrow"}, "start_at", "ISO 8601"),
        ({**GOOD, "start_at": 17}, "start_at", "must be a string"),
    ],
)
def test_bad_definitions_are_400_naming_the_field(
    service, operator_of_schedules, body, field, words
):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = operator_of_schedules.post(API, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field, response.json()
    assert words in response.json()["error"], response.json()
    assert nothing_stored(service)


def test_a_bad_redefinition_leaves_the_schedule_as_it_was(service, client):
    service.schedule("keep", HOOK, {"v": 1}, every=60)
    before = service.get_schedule("keep")
    for change in ({"every": 0}, {"cron": "nope", "every": None}, {"queue": ""}):
        response = signed_post(client, API, {**GOOD, "schedule_id": "keep", **change})
        assert response.status_code == 400, response.content
    assert service.get_schedule("keep") == before


@pytest.mark.parametrize(
    ("query", "field", "words"),
    [
        ("limit=-1", "limit", "whole number >= 0"),
        ("limit=ten", "limit", "whole number >= 0"),
        ("limit=1.5", "limit", "whole number"),
        ("limit=", "limit", "whole number"),
        ("limit=%D9%A3", "limit", "whole number"),  # an Arabic-Indic 3 is a digit to Python
        ("limit=1001", "limit", "at most 1000"),
        ("offset=x", "offset", "whole number >= 0"),
        ("limit=1&limit=2", "limit", "more than once"),
        ("paused=yes", "paused", "true or false"),
        ("paused=1", "paused", "true or false"),
        ("paused=True", "paused", "true or false"),
        ("page=2", "page", "unknown query parameter 'page'"),
    ],
)
def test_bad_list_queries_are_400_naming_the_parameter(service, client, query, field, words):
    response = signed_get(client, f"{API}?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field and words in response.json()["error"]


def test_unknown_ids_are_404(service, operator_of_schedules):
    client = operator_of_schedules
    service.schedule("known", HOOK, every=60)
    for response, schedule_id in (
        (client.get(f"{API}nope/"), "nope"),
        (client.delete(f"{API}nope/"), "nope"),
        (post_json(client, f"{API}nope/pause/"), "nope"),
        (post_json(client, f"{API}nope/resume/"), "nope"),
        (post_json(client, f"{API}nope/delete/"), "nope"),
        (client.get(f"{API}known/extra/"), "known/extra"),
        (signed_get(Client(), f"{API}nope/"), "nope"),
        (signed_delete(Client(), f"{API}nope/"), "nope"),
    ):
        assert response.status_code == 404, response.content
        assert response.json()["field"] == "schedule_id"
        assert f"no schedule {schedule_id!r}" == response.json()["error"]
    assert [s.schedule_id for s in service.list_schedules()] == ["known"]
    assert not service.get_schedule("known").paused


def test_wrong_methods_are_405(service, operator_of_schedules):
    client = operator_of_schedules
    service.schedule("m", HOOK, every=60)
    for response, allowed in (
        (client.put(API), "GET, POST"),
        (client.delete(API), "GET, POST"),
        (client.put(f"{API}m/"), "GET, DELETE"),
        (post_json(client, f"{API}m/"), "GET, DELETE"),
        (client.get(f"{API}m/pause/"), "POST"),
        (client.delete(f"{API}m/resume/"), "POST"),
        (client.get(f"{API}m/delete/"), "POST"),
        (client.delete(f"{API}m/delete/"), "POST"),
    ):
        assert response.status_code == 405, response.content
        assert response["Allow"] == allowed and "not allowed" in response.json()["error"]
    assert service.get_schedule("m") is not None and not service.get_schedule("m").paused


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=ADMIN_APPS)
def test_an_unreachable_redis_is_503(client):
    config = {
        "STORAGE": "redis",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "KEY_PREFIX": "test-unreachable",
        "API_KEYS": {KEY_ID: SECRET},
    }
    with override_settings(RELIABLE_EXECUTOR=config):
        definition = {"schedule_id": "u", "task_name": HOOK, "every": 60}
        for response in (
            signed_get(client, API),
            signed_post(client, API, definition),
            signed_post(client, f"{API}u/pause/"),
        ):
            assert response.status_code == 503, response.content
            assert "storage unavailable" in response.json()["error"]
        login(client, "view_reliableschedule", "delete_reliableschedule")
        assert client.get(f"{API}u/").status_code == 503
        assert client.delete(f"{API}u/").status_code == 503


def test_the_urls_have_names():
    from django.urls import reverse

    name = "reliable_executor_api:"
    assert reverse(name + "schedules") == API
    assert reverse(name + "schedule-detail", args=["a/b"]) == f"{API}a/b/"
    for action in ("pause", "resume", "delete"):
        assert reverse(f"{name}schedule-{action}", args=["x"]) == f"{API}x/{action}/"
