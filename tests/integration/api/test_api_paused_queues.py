"""The HTTP API's paused queues on every storage: list, pause, resume; bad and unknown names;
signed requests (who may list or pause: tests/integration/test_permissions.py)."""

from __future__ import annotations

from tests.support.api_support import login, post_json, signed_get, signed_post

QUEUES = "/executor/api/queues/"
HOOK = "contract.hook"


def test_pause_list_and_resume_with_a_session(service, client):
    operator = login(client, "view_reliabletask", "operate_reliabletask")
    service.submit(HOOK, task_id="t1", queue="emails")
    assert operator.get(f"{QUEUES}paused/").json() == {"paused_queues": []}
    response = post_json(operator, f"{QUEUES}emails/pause/")
    assert response.status_code == 200
    assert response.json() == {"queue": "emails", "paused": True, "changed": True}
    assert service.paused_queues() == {"emails"}
    again = post_json(operator, f"{QUEUES}emails/pause/")
    assert again.json() == {"queue": "emails", "paused": True, "changed": False}
    assert operator.get(f"{QUEUES}paused/").json() == {"paused_queues": ["emails"]}
    response = post_json(operator, f"{QUEUES}emails/resume/")
    assert response.json() == {"queue": "emails", "paused": False, "changed": True}
    again = post_json(operator, f"{QUEUES}emails/resume/")
    assert (again.status_code, again.json()["changed"]) == (200, False)
    assert service.paused_queues() == set()


def test_unknown_queue_is_404_and_a_bad_name_400_naming_the_field(service, client):
    operator = login(client, "view_reliabletask", "operate_reliabletask")
    for action in ("pause", "resume"):
        response = post_json(operator, f"{QUEUES}mial/{action}/")
        assert response.status_code == 404
        assert response.json()["field"] == "queue"
        assert "unknown queue 'mial'" in response.json()["error"]
        response = post_json(operator, f"{QUEUES}a,b/{action}/")
        assert response.status_code == 400
        assert response.json()["field"] == "queue"
        assert "1..100 characters without whitespace or commas" in response.json()["error"]
    assert service.paused_queues() == set()


def test_signed_pause_and_list(service, client):
    service.submit(HOOK, task_id="t1", queue="emails")
    assert signed_post(client, f"{QUEUES}emails/pause/").json()["changed"] is True
    assert signed_get(client, f"{QUEUES}paused/").json() == {"paused_queues": ["emails"]}
    assert signed_post(client, f"{QUEUES}emails/resume/").json()["changed"] is True
