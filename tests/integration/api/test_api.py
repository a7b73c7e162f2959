"""The HTTP API (django_reliable_executor.api) on every storage (SQLite, MariaDB, PostgreSQL,
Redis) through Django's test client: submit/get/cancel/retry, bad input, session permissions and
CSRF, HMAC-signed requests and their nonce stores (a table, or Redis under the key prefix)."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import time
import uuid
from typing import Any
from urllib.parse import quote

import pytest
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client, override_settings

from django_reliable_executor.api import nonces
from django_reliable_executor.core.progress import make_progress
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.database import locks as nonce_rows
from tests.conftest import BACKENDS, db_params, redis_client
from tests.support.admin_support import ADMIN_APPS, boom, run_one
from tests.support.api_support import (
    API,
    HOOK,
    KEY_ID,
    SECRET,
    api_executor,
    canonical,
    login,
    post_json,
    rejected,
    signed_get,
    signed_headers,
    signed_post,
)
from tests.support.contract_support import HOOKS, claim_and_start


# -- happy paths (session) --------------------------------------------------------------------
def test_submit_get_cancel_retry_with_a_session(service, operator):
    response = post_json(
        operator,
        API,
        {
            "task_name": HOOK,
            "task_parameter": {"order": 7},
            "task_id": "api-1",
            "queue": "emails",
            "priority": 3,
            "delay_millis": 3_600_000,
            "retry_limit": 1,
        },
    )
    assert response.status_code == 201, response.content
    task = response.json()
    assert task["task_id"] == "api-1" and task["status"] == "CREATED"
    assert task["parameter"] == {"order": 7} and task["queue"] == "emails"
    assert task["priority"] == 3 and task["retry_limit"] == 1
    created = dt.datetime.fromisoformat(task["created_at"])
    assert dt.datetime.fromisoformat(task["run_at"]) - created == dt.timedelta(hours=1)
    assert created.utcoffset() == dt.timedelta(0)
    assert service.get_task("api-1").queue == "emails"

    # Same id again: the stored task as is.
    again = post_json(operator, API, {"task_name": HOOK, "task_id": "api-1", "priority": 9})
    assert again.status_code == 201 and again.json()["priority"] == 3

    got = operator.get(f"{API}api-1/")
    assert got.status_code == 200 and got.json() == task

    cancelled = post_json(operator, f"{API}api-1/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["cancelled"] is True
    assert cancelled.json()["task"]["status"] == "CANCELLED"
    assert service.get_task("api-1").status is TaskStatus.CANCELLED

    again = post_json(operator, f"{API}api-1/cancel/")
    assert again.status_code == 409
    assert again.json()["task"]["status"] == "CANCELLED" and "CANCELLED" in again.json()["error"]

    retried = post_json(operator, f"{API}api-1/retry/")
    assert retried.status_code == 200 and retried.json()["retried"] is True
    assert retried.json()["task"]["status"] == "PENDING"
    assert post_json(operator, f"{API}api-1/retry/").status_code == 409


def test_a_unique_submit_returns_the_live_task_of_its_key(service, operator):
    body = {"task_name": HOOK, "task_parameter": {"order": 8}, "unique_for": 60}
    first = post_json(operator, API, body)
    assert first.status_code == 201, first.content
    again = post_json(operator, API, {**body, "priority": 5})
    assert again.status_code == 201 and again.json() == first.json()
    bad = post_json(operator, API, {**body, "unique_for": 0})
    assert bad.status_code == 400 and bad.json()["field"] == "unique_for"
    assert len(service.list_tasks()) == 1


def test_a_submit_with_depends_on_waits_and_shows_what_it_awaits(service, operator):
    assert post_json(operator, API, {"task_name": HOOK, "task_id": "api-a"}).status_code == 201
    body = {"task_name": HOOK, "task_id": "api-b", "depends_on": ["api-a"]}
    created = post_json(operator, API, body)
    assert created.status_code == 201, created.content
    assert created.json()["depends_on"] == ["api-a"]
    assert created.json()["waiting_for"] == ["api-a"]
    missing = post_json(operator, API, {**body, "task_id": "api-c", "depends_on": ["nope"]})
    assert missing.status_code == 400 and missing.json()["field"] == "depends_on"
    assert service.get_task("api-c") is None


def test_a_submit_with_attempt_timeout_stores_and_shows_it(service, operator):
    body = {"task_name": HOOK, "task_id": "api-t", "attempt_timeout": 2.5}
    created = post_json(operator, API, body)
    assert created.status_code == 201, created.content
    assert created.json()["attempt_timeout"] == 2.5
    assert operator.get(f"{API}api-t/").json()["attempt_timeout"] == 2.5
    assert service.get_task("api-t").attempt_timeout == 2.5
    plain = post_json(operator, API, {"task_name": HOOK, "task_id": "api-u"})
    assert plain.json()["attempt_timeout"] is None


def test_the_task_json_carries_the_progress(service, operator):
    service.submit(HOOK, None, task_id="api-p")
    assert operator.get(f"{API}api-p/").json()["progress"] is None
    claim = claim_and_start(service.storage)
    reported = make_progress(2.5, 4, "half way", service.clock.now())
    assert service.storage.record_progress([(claim, reported)]) == 1
    assert operator.get(f"{API}api-p/").json()["progress"] == {
        "current": 2.5,
        "total": 4,
        "message": "half way",
        "updated_at": reported["updated_at"].isoformat(),
    }


def test_retry_of_a_failed_task_and_run_at(service, operator):
    response = post_json(operator, API, {"task_name": HOOK, "task_id": "api-f", "retry_limit": 0})
    assert response.status_code == 201
    HOOKS["api-f"] = lambda context: 1 / 0
    assert run_one(service) is TaskStatus.FAILED
    got = operator.get(f"{API}api-f/").json()
    assert got["status"] == "FAILED" and "ZeroDivisionError" in got["last_error"]
    assert got["finished_at"] is not None
    retried = post_json(operator, f"{API}api-f/retry/")
    assert retried.status_code == 200 and retried.json()["task"]["status"] == "PENDING"

    later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).replace(microsecond=0)
    response = post_json(
        operator, API, {"task_name": HOOK, "task_id": "api-r", "run_at": later.isoformat()}
    )
    assert response.status_code == 201
    assert dt.datetime.fromisoformat(response.json()["run_at"]) == later


def test_task_ids_with_a_slash_and_unknown_ids(service, operator):
    assert post_json(operator, API, {"task_name": HOOK, "task_id": "order/42"}).status_code == 201
    assert operator.get(f"{API}order/42/").json()["task_id"] == "order/42"
    for response in (
        operator.get(f"{API}nope/"),
        post_json(operator, f"{API}nope/cancel/"),
        post_json(operator, f"{API}nope/retry/"),
    ):
        assert response.status_code == 404
        assert response.json()["field"] == "task_id" and "nope" in response.json()["error"]


# -- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"\xff\xfe", None, "not valid JSON"),
        (b"[1, 2]", None, "JSON object"),
        (b"", None, "not valid JSON"),
        ({"task_name": HOOK, "colour": "red"}, "colour", "unknown field"),
        ({"task_parameter": 1}, "task_name", "required"),
        ({"task_name": 5}, "task_name", "task_name"),
        ({"task_name": "no.such.task"}, "task_name", "no registered handler"),
        ({"task_name": HOOK, "priority": "5"}, "priority", "32-bit integer"),
        ({"task_name": HOOK, "priority": True}, "priority", "32-bit integer"),
        ({"task_name": HOOK, "retry_limit": 1.5}, "retry_limit", "integer"),
        ({"task_name": HOOK, "task_id": 12}, "task_id", "must be a string"),
        ({"task_name": HOOK, "task_id": "a b"}, "task_id", "whitespace"),
        ({"task_name": HOOK, "task_id": "nightly@20261129T030000Z"}, "task_id", "schedule's run"),
        ({"task_name": HOOK, "queue": ""}, "queue", "queue"),
        ({"task_name": HOOK, "delay_millis": -1}, "delay_millis", "delay_millis"),
        ({"task_name": HOOK, "retry_backoff": "linear"}, "retry_backoff", "retry_backoff"),
        ({"task_name": HOOK, "run_at": "2030-01-01T00:00:00"}, "run_at", "UTC offset"),
        ({"task_name": HOOK, "run_at": "tomorrow"}, "run_at", "ISO 8601"),
        ({"task_name": HOOK, "run_at": 17}, "run_at", "ISO 8601"),
        ({"task_name": HOOK, "attempt_timeout": 0}, "attempt_timeout", "got 0"),
        ({"task_name": HOOK, "attempt_timeout": -1.5}, "attempt_timeout", "got -1.5"),
        ({"task_name": HOOK, "attempt_timeout": "30"}, "attempt_timeout", "got '30'"),
        ({"task_name": HOOK, "attempt_timeout": True}, "attempt_timeout", "got True"),
        ({"task_name": HOOK, "attempt_timeout": 1e300}, "attempt_timeout", "at most"),
    ],
)
def test_bad_submits_are_400_naming_the_field(service, operator, body, field, words):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = operator.post(API, raw, content_type="application/json")
    assert response.status_code == 400, response.content
    assert response.json()["field"] == field
    assert words in response.json()["error"]
    assert service.list_tasks() == []


def test_a_body_over_the_upload_limit_is_413(service, operator, client):
    body = {"task_name": HOOK, "task_parameter": "x" * 2000}
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        response = post_json(operator, API, body)
        assert response.status_code == 413
        assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in response.json()["error"]
        operator.logout()
        assert signed_post(client, API, body).status_code == 413


def test_wrong_methods_are_405(service, operator):
    for response, allowed in (
        (operator.put(API), "POST, GET"),
        (operator.put(f"{API}x/"), "GET"),
        (post_json(operator, f"{API}x/"), "GET"),
        (operator.get(f"{API}x/cancel/"), "POST"),
        (operator.delete(f"{API}x/retry/"), "POST"),
    ):
        assert response.status_code == 405
        assert response["Allow"] == allowed and "not allowed" in response.json()["error"]


# -- permission to submit is not permission to read -------------------------------------------
SECRET_PARAMETER = {"card": "4111-secret-parameter"}


def _finished_tasks(service: ReliableExecutor) -> None:
    """``done`` COMPLETED with a secret result, ``broke`` FAILED with a secret error, both
    with a secret parameter, and ``holder`` waiting, holding a unique key."""
    service.submit(HOOK, SECRET_PARAMETER, task_id="done")
    HOOKS["done"] = lambda context: {"token": "secret-result"}
    assert run_one(service) is TaskStatus.COMPLETED
    service.submit(HOOK, SECRET_PARAMETER, task_id="broke", retry_limit=0)
    HOOKS["broke"] = boom
    assert run_one(service) is TaskStatus.FAILED
    service.submit(HOOK, SECRET_PARAMETER, task_id="holder", unique_for=600, delay_millis=600_000)
    service.submit(
        HOOK, None, task_id="keyed", unique_for=600, unique_key="k-1", delay_millis=600_000
    )


def test_a_submitter_without_view_permission_reads_nothing_of_an_existing_task(service, client):
    _finished_tasks(service)
    login(client, "add_reliabletask")
    for task_id in ("done", "broke", "holder"):
        assert client.get(f"{API}{task_id}/").status_code == 403
        answer = post_json(client, API, {"task_name": HOOK, "task_id": task_id})
        assert answer.status_code == 201, answer.content
        assert answer.json() == {"existing": True, "task_id": task_id}
    # The live holder of a unique key: neither its content nor its id.
    for body in (
        {"task_name": HOOK, "task_parameter": SECRET_PARAMETER, "unique_for": 60},
        {"task_name": HOOK, "unique_for": 60, "unique_key": "k-1"},
        {"task_name": HOOK, "task_id": "mine", "unique_for": 60, "unique_key": "k-1"},
    ):
        answer = post_json(client, API, body)
        assert answer.status_code == 201, answer.content
        assert answer.json() == {"existing": True, "task_id": None}
    assert service.get_task("mine") is None
    assert len(service.list_tasks()) == 4
    # What it submits itself it gets back whole: its own content.
    fresh = post_json(client, API, {"task_name": HOOK, "task_id": "own", "task_parameter": 7})
    assert fresh.status_code == 201
    assert fresh.json()["task_id"] == "own" and fresh.json()["parameter"] == 7
    # A caller who may read tasks gets the existing task whole, as before.
    login(client, "add_reliabletask", "view_reliabletask")
    answer = post_json(client, API, {"task_name": HOOK, "task_id": "done"})
    assert answer.status_code == 201 and answer.json()["result"] == {"token": "secret-result"}


def test_depends_on_without_view_permission_is_refused_alike_for_stored_and_unknown_ids(
    service, client
):
    service.submit(HOOK, None, task_id="stored", delay_millis=600_000)
    login(client, "add_reliabletask")
    answers = [
        post_json(client, API, {"task_name": HOOK, "task_id": f"d-{i}", "depends_on": ids})
        for i, ids in enumerate((["stored"], ["nope"], ["stored", "nope"]))
    ]
    assert {a.status_code for a in answers} == {403}
    assert len({a.content for a in answers}) == 1  # one answer, whichever ids exist
    assert answers[0].json()["field"] == "depends_on"
    assert "view_reliabletask" in answers[0].json()["error"]
    assert [t.task_id for t in service.list_tasks()] == ["stored"]
    # With the permission: stored ids are accepted, unknown ones named.
    login(client, "add_reliabletask", "view_reliabletask")
    ok = post_json(client, API, {"task_name": HOOK, "task_id": "d-ok", "depends_on": ["stored"]})
    assert ok.status_code == 201, ok.content
    missing = post_json(client, API, {"task_name": HOOK, "depends_on": ["nope"]})
    assert missing.status_code == 400 and "'nope'" in missing.json()["error"]


def test_operating_without_view_permission_answers_only_id_and_status(service, client):
    _finished_tasks(service)
    login(client, "operate_reliabletask")
    for path, status in (
        (f"{API}done/cancel/", 409),
        (f"{API}done/retry/", 409),
        (f"{API}broke/retry/", 200),
        (f"{API}broke/cancel/", 200),
    ):
        answer = post_json(client, path)
        assert answer.status_code == status, answer.content
        task = answer.json()["task"]
        assert set(task) == {"task_id", "status"}, task
        assert b"secret" not in answer.content


# -- sessions: CSRF (each role's cells: tests/integration/test_permissions.py) ----------------
def test_session_posts_need_the_csrf_token(service):
    client = login(Client(enforce_csrf_checks=True), "add_reliabletask")
    response = post_json(client, API, {"task_name": HOOK, "task_id": "c1"})
    assert response.status_code == 403 and "CSRF" in response.json()["error"]
    assert service.get_task("c1") is None
    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    response = post_json(client, API, {"task_name": HOOK, "task_id": "c1"}, X_CSRFToken=token)
    assert response.status_code == 201


# -- signed requests ---------------------------------------------------------------------------
def test_signed_submit_get_cancel_retry_without_csrf(service):
    client = Client(enforce_csrf_checks=True)  # signed requests are CSRF-exempt
    response = signed_post(client, API, {"task_name": HOOK, "task_id": "s1", "delay_millis": 9})
    assert response.status_code == 201, response.content
    assert signed_get(client, f"{API}s1/").json()["task_id"] == "s1"
    assert signed_post(client, f"{API}s1/cancel/").json()["task"]["status"] == "CANCELLED"
    assert signed_post(client, f"{API}s1/retry/").json()["task"]["status"] == "PENDING"


def test_the_query_string_is_signed(service, client):
    service.submit(HOOK, task_id="q1")
    assert signed_get(client, f"{API}q1/?verbose=1").status_code == 200
    headers = signed_headers("GET", f"{API}q1/")
    assert client.get(f"{API}q1/?verbose=1", headers=headers).status_code == 401


def test_a_percent_encoded_path_is_signed_as_sent(service, client):
    service.submit(HOOK, task_id="café/1")
    path = quote(f"{API}café/1/", safe="/:@&+$,-_.!~*'()")
    assert path == f"{API}caf%C3%A9/1/"
    response = signed_get(client, path)
    assert response.status_code == 200 and response.json()["task_id"] == "café/1"


def signed_as_sent(method: str, sent: str) -> dict[str, str]:
    """Headers signing ``sent`` byte for byte, not its canonical form."""
    headers = signed_headers(method, sent)
    ts, nonce = headers["X-Executor-Timestamp"], headers["X-Executor-Nonce"]
    text = "\n".join([KEY_ID, method, sent, ts, nonce, hashlib.sha256(b"").hexdigest()])
    headers["X-Executor-Signature"] = hmac.new(
        SECRET.encode(), text.encode(), hashlib.sha256
    ).hexdigest()
    return headers


def test_a_path_with_a_colon_is_signed_alike_in_either_encoding(service, client):
    task_id = "nightly@2026-01-01T03:00:00Z"
    service.submit(HOOK, task_id=task_id)
    raw = f"{API}{task_id}/?verbose=1&x=a:b+c"
    encoded = quote(f"{API}{task_id}/") + "?verbose=1&x=a%3Ab%20c"  # quote's defaults: %3A, %40
    assert ":" not in encoded and canonical(raw) == canonical(encoded) == encoded
    for sent in (raw, encoded):
        # Signed as the client of docs/api.md signs it: the canonical form of what it sends.
        response = client.get(sent, headers=signed_headers("GET", sent))
        assert response.status_code == 200, (sent, response.content)
        assert response.json()["task_id"] == task_id
    # A client that encodes as urllib.parse.quote does signs exactly what it sends...
    assert signed_get(client, encoded).status_code == 200
    assert client.get(encoded, headers=signed_as_sent("GET", encoded)).status_code == 200
    # ...and a signature of a non-canonical form is refused, whichever way it was sent.
    rejected(client.get(raw, headers=signed_as_sent("GET", raw)), "bad signature")
    rejected(client.get(encoded, headers=signed_as_sent("GET", raw)), "bad signature")


def test_an_unknown_key_id_is_answered_like_a_bad_signature(service, client, caplog):
    caplog.set_level(logging.WARNING, logger="django_reliable_executor")
    path, body = API, json.dumps({"task_name": HOOK, "task_id": "k1"}).encode()
    unknown = post_json(client, path, body, **signed_headers("POST", path, body, key_id="ops-2"))
    bad = post_json(client, path, body, **signed_headers("POST", path, body, secret="x" * 40))
    assert (unknown.status_code, unknown.json()) == (bad.status_code, bad.json())
    assert (unknown.status_code, unknown.json()["error"]) == (401, "bad signature")
    assert unknown.content == bad.content
    assert unknown["WWW-Authenticate"] == bad["WWW-Authenticate"]
    assert service.get_task("k1") is None
    logged = [r.getMessage() for r in caplog.records if "signed request refused" in r.getMessage()]
    assert len(logged) == 2
    assert "unknown key id 'ops-2'" in logged[0] and "POST /executor/api/tasks/" in logged[0]
    assert f"bad signature for key id {KEY_ID!r}" in logged[1]


def test_bad_signatures_are_401(service, client):
    path, body = API, json.dumps({"task_name": HOOK, "task_id": "b1"}).encode()
    # Signed with another secret.
    rejected(
        post_json(client, path, body, **signed_headers("POST", path, body, secret="x" * 40)),
        "bad signature",
    )
    # A body other than the signed one.
    headers = signed_headers("POST", path, b'{"task_name": "contract.hook"}')
    rejected(post_json(client, path, body, **headers), "bad signature")
    # Signed for another path or method.
    rejected(
        post_json(client, path, body, **signed_headers("POST", f"{API}x/", body)), "bad signature"
    )
    rejected(post_json(client, path, body, **signed_headers("PUT", path, body)), "bad signature")
    # Unknown key id: answered alike (see test_an_unknown_key_id_is_answered_like_a_bad_signature).
    rejected(
        post_json(client, path, body, **signed_headers("POST", path, body, key_id="ops-2")),
        "bad signature",
    )
    # A header missing, a malformed timestamp or nonce.
    headers = signed_headers("POST", path, body)
    del headers["X-Executor-Nonce"]
    rejected(post_json(client, path, body, **headers), "without the X-Executor-Nonce header")
    headers = signed_headers("POST", path, body)
    headers["X-Executor-Timestamp"] = "12.5"
    rejected(post_json(client, path, body, **headers), "whole seconds")
    rejected(
        post_json(client, path, body, **signed_headers("POST", path, body, nonce="short")),
        "16..64 characters",
    )
    assert service.get_task("b1") is None


def test_timestamps_outside_the_window_are_401(service, client):
    service.submit(HOOK, task_id="w1")
    now = int(time.time())
    # 30 s beyond the 300 s window: a timestamp 301 s ahead came within it once the server
    # read its clock more than a second after this test did (a loaded machine).
    for ts in (now - 330, now + 330, 0):
        rejected(signed_get(client, f"{API}w1/", timestamp=ts), "outside the signature window")
    assert signed_get(client, f"{API}w1/", timestamp=now - 250).status_code == 200
    with override_settings(RELIABLE_EXECUTOR={**_config(), "API_SIGNATURE_WINDOW": 10}):
        rejected(signed_get(client, f"{API}w1/", timestamp=now - 30), "window of 10 seconds")


def _config() -> dict[str, Any]:
    from django.conf import settings

    return dict(settings.RELIABLE_EXECUTOR)


def test_no_keys_configured_means_no_signed_access(service, client):
    with override_settings(RELIABLE_EXECUTOR={**_config(), "API_KEYS": {}}):
        rejected(signed_get(client, f"{API}x/"), "bad signature")


def test_a_replayed_nonce_is_401(service, client):
    body = json.dumps({"task_name": HOOK, "task_id": "n1"}).encode()
    headers = signed_headers("POST", API, body)
    assert post_json(client, API, body, **headers).status_code == 201
    rejected(post_json(client, API, body, **headers), "nonce already used")
    # The same nonce signed afresh (new timestamp) is still spent...
    again = signed_headers(
        "POST", API, body, nonce=headers["X-Executor-Nonce"], timestamp=int(time.time()) + 1
    )
    rejected(post_json(client, API, body, **again), "nonce already used")
    # ...but a bad signature never spends one.
    fresh = uuid.uuid4().hex
    rejected(signed_get(client, f"{API}n1/", nonce=fresh, secret="y" * 40), "bad signature")
    assert signed_get(client, f"{API}n1/", nonce=fresh).status_code == 200


def test_nonces_are_kept_in_the_executors_store(service, client):
    nonce = uuid.uuid4().hex
    assert signed_get(client, f"{API}x/", nonce=nonce).status_code == 404
    if service.settings.STORAGE == "redis":
        key = "{" + service.settings.KEY_PREFIX + "}:api-nonce:" + f"{KEY_ID}:{nonce}"
        redis = redis_client()
        try:
            assert redis.get(key) == "1"
            assert 600_000 < redis.pttl(key) <= 601_000  # two windows and a second
        finally:
            redis.close()
    else:
        from django_reliable_executor.models import ReliableApiNonce

        rows = ReliableApiNonce.objects.using(service.settings.DATABASE_ALIAS)
        row = rows.get(key=f"{KEY_ID}:{nonce}")
        left = row.expires_at - dt.datetime.now(dt.timezone.utc)
        assert dt.timedelta(seconds=599) < left <= dt.timedelta(seconds=601)


@pytest.mark.parametrize("backend", db_params(BACKENDS))
def test_nonces_differing_only_in_case_are_two_nonces(backend):
    with api_executor(backend):
        assert nonces.claim(KEY_ID, "abcdefghijklmnop", 60)
        assert nonces.claim(KEY_ID, "ABCDEFGHIJKLMNOP", 60)
        assert not nonces.claim(KEY_ID, "ABCDEFGHIJKLMNOP", 60)


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=ADMIN_APPS)
def test_database_nonces_expire_and_are_purged():
    from django_reliable_executor.models import ReliableApiNonce

    with api_executor("default"):
        assert nonces.claim(KEY_ID, "n" * 16, 60)
        assert not nonces.claim(KEY_ID, "n" * 16, 60)
        assert nonces.claim("other", "n" * 16, 60)  # per key id
        # An expired row is no replay, even before the purge gets to it.
        past = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=1)
        ReliableApiNonce.objects.filter(key=f"{KEY_ID}:{'n' * 16}").update(expires_at=past)
        assert nonces.claim(KEY_ID, "n" * 16, 60)
        ReliableApiNonce.objects.create(key="old:x", expires_at=past)
        nonce_rows._last_purge = 0.0  # the next claim purges
        assert nonces.claim(KEY_ID, "m" * 16, 60)
        assert not ReliableApiNonce.objects.filter(key="old:x").exists()


@pytest.mark.django_db(transaction=True, databases=["default"], available_apps=ADMIN_APPS)
def test_an_unreachable_redis_is_503_for_sessions_and_signed_requests(client):
    config = {
        "STORAGE": "redis",
        "REDIS_URL": "redis://127.0.0.1:1/0",
        "KEY_PREFIX": "test-unreachable",
        "API_KEYS": {KEY_ID: SECRET},
    }
    with override_settings(RELIABLE_EXECUTOR=config):
        response = signed_get(client, f"{API}x/")
        assert response.status_code == 503, response.content
        assert "task storage unavailable" in response.json()["error"]
        login(client, "view_reliabletask")
        assert client.get(f"{API}x/").status_code == 503


def test_retry_of_a_dependent_whose_dependency_failed_is_409_saying_why(service, operator):
    service.submit(HOOK, None, task_id="dep", retry_limit=0)
    service.submit(HOOK, None, task_id="child", depends_on=["dep"])
    HOOKS["dep"] = boom
    assert run_one(service) is TaskStatus.FAILED
    refused = post_json(operator, f"{API}child/retry/")
    assert refused.status_code == 409
    assert "not retried: its dependency dep ended FAILED" in refused.json()["error"]
    assert refused.json()["task"]["status"] == "CANCELLED"
    # Retried after its dependency: it waits for the new run.
    assert post_json(operator, f"{API}dep/retry/").status_code == 200
    retried = post_json(operator, f"{API}child/retry/")
    assert retried.status_code == 200
    assert retried.json()["task"]["status"] == "CREATED"
    assert retried.json()["task"]["waiting_for"] == ["dep"]


def test_retry_while_a_timed_out_handler_still_runs_is_409_saying_where(service, operator):
    service.submit("demo.echo", None, task_id="late", max_duration_millis=1)
    claim_and_start(service.storage, "w-late")
    time.sleep(0.01)
    assert [t.task.task_id for t in service.storage.expire_overdue(10)] == ["late"]
    refused = post_json(operator, f"{API}late/retry/")
    assert refused.status_code == 409
    assert "previous attempt is still running on worker w-late" in refused.json()["error"]
    assert refused.json()["task"]["status"] == "TIMEOUT"
