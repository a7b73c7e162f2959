"""The admin's task pages on every storage (SQLite, MariaDB, PostgreSQL, Redis), through Django's
test client with real users and permissions: list, summary, filters, search, pagination, detail,
retry/cancel actions and who may do what."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.messages import get_messages
from django.urls import NoReverseMatch, reverse

from django_reliable_executor import signals
from django_reliable_executor.admin import task_pages as pages
from django_reliable_executor.core.progress import make_progress
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.registry import key_limits, rate_limits
from tests.support.admin_support import (
    LIST_URL,
    NEWEST_FIRST,
    POPULATED,
    admin_params,
    detail_url,
    executor_on,
    make_user,
    message_texts,
)
from tests.support.contract_support import claim_and_start, new_task, recording


def listed(response: Any) -> list[str]:
    return [row.task.task_id for row in response.context["rows"]]


def status_of(service: Any, task_id: str) -> TaskStatus:
    return service.get_task(task_id).status


# -- the list ---------------------------------------------------------------------------------
def test_list_shows_every_task_newest_first_with_its_columns(service, viewer):
    response = viewer.get(LIST_URL)
    assert response.status_code == 200
    assert listed(response) == NEWEST_FIRST
    html = response.content.decode()
    for task_id, status, _ in POPULATED:
        row = re.search(rf'<tr data-task-id="{task_id}" data-status="(\w+)">(.*?)</tr>', html, re.S)
        assert row is not None, task_id
        assert row.group(1) == status.value
        assert f"re-status-{status.value.lower()}" in row.group(2)  # colour-coded
    # Next run only for waiting tasks; duration for finished ones; total from the counters.
    rows = {row.task.task_id: row for row in response.context["rows"]}
    assert rows["t-created"].next_run is not None and rows["t-completed"].next_run is None
    assert rows["t-completed"].duration and not rows["t-created"].duration
    assert rows["t-running"].duration.endswith("so far")
    assert response.context["total"] == len(POPULATED)
    assert response.context["next_url"] is None and response.context["previous_url"] is None
    assert "Tasks 1&ndash;8 of 8, newest first." in html


def test_summary_counts_by_status_and_queue_master_workers_and_oldest_due(service, viewer):
    storage = service.storage
    storage.worker_seen("worker-a", {"hostname": "host-1", "pid": 41, "queues": ["default"]})
    storage.worker_seen("worker-b", {"hostname": "host-2", "pid": 42, "queues": ["emails"]})
    assert storage.acquire_lock("master", "worker-b", 30)
    response = viewer.get(LIST_URL)
    summary = response.context["summary"]
    by_queue = {q.queue: {s: n for s, n, _ in q.counts} for q in summary["queues"]}
    assert by_queue["default"][TaskStatus.FAILED] == 1
    assert by_queue["emails"] == {
        **{s: 0 for s in TaskStatus},
        TaskStatus.FAILED: 1,
        TaskStatus.CREATED: 1,
    }
    totals = {s: n for s, n, _ in summary["totals"]}
    assert totals[TaskStatus.CREATED] == 2 and totals[TaskStatus.RUNNING] == 1
    assert summary["grand_total"] == len(POPULATED)
    # t-created is due and unclaimed: the oldest due task (t-later is not due yet).
    assert summary["oldest_due_at"] == service.get_task("t-created").run_at
    assert summary["master"] == "worker-b"
    assert [w["info"].worker_id for w in summary["workers"]] == ["worker-a", "worker-b"]
    html = response.content.decode()
    assert "worker-b (master)" in html and "host-1 pid 41" in html
    # Each count links to the list of those tasks.
    assert '<a href="?status=FAILED&amp;queue=emails">1</a>' in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status=FAILED", ["t-failed-emails", "t-failed"]),
        ("queue=emails", ["t-later", "t-failed-emails"]),
        ("status=CREATED&queue=emails", ["t-later"]),
        ("task_name=contract.hook", NEWEST_FIRST),
        ("task_name=no.such.task", []),
        ("status=NOT_A_STATUS", NEWEST_FIRST),  # an unknown value is no filter
    ],
)
def test_filters(service, viewer, query, expected):
    response = viewer.get(f"{LIST_URL}?{query}")
    assert response.status_code == 200
    assert listed(response) == expected


def test_filter_totals_come_from_the_counters_except_for_a_task_name(service, viewer):
    assert viewer.get(LIST_URL + "?status=FAILED").context["total"] == 2
    assert viewer.get(LIST_URL + "?queue=emails&status=CREATED").context["total"] == 1
    response = viewer.get(LIST_URL + "?task_name=contract.hook")
    assert response.context["total"] is None  # no counter by name: not counted
    assert "Tasks 1&ndash;8, newest first." in response.content.decode()


def test_filter_sidebar_offers_statuses_queues_and_registered_names(service, viewer):
    response = viewer.get(LIST_URL + "?queue=emails")
    choices = {f["name"]: f["links"] for f in response.context["filter_choices"]}
    assert [link["label"] for link in choices["status"]] == [
        "All",
        *(s.value for s in TaskStatus),
        "Dead letters",
    ]
    assert [link["label"] for link in choices["queue"]] == ["All", "default", "emails"]
    assert [link["label"] for link in choices["queue"] if link["selected"]] == ["emails"]
    names = [link["label"] for link in choices["task_name"]]
    assert "contract.hook" in names and "demo.echo" in names
    # A status link keeps the queue filter and goes back to page 1.
    failed = next(link for link in choices["status"] if link["label"] == "FAILED")
    assert failed["url"] == "?status=FAILED&queue=emails"


# -- dead letters -----------------------------------------------------------------------------
def add_timeout_and_error(service: Any) -> None:
    """A TIMEOUT and then an ERROR task (newer than every POPULATED one), in a queue of their
    own so that each claim here takes exactly the task meant."""
    service.submit("contract.hook", None, task_id="t-timeout", queue="dlq", max_duration_millis=1)
    time.sleep(0.01)
    assert [t.task.task_id for t in service.storage.expire_overdue(10)] == ["t-timeout"]
    service.submit("contract.hook", None, task_id="t-error", queue="dlq")
    claim = claim_and_start(service.storage, queue="dlq")
    assert service.storage.fail(claim, "no handler", retryable=False, is_error=True) is not None
    assert status_of(service, "t-timeout") is TaskStatus.TIMEOUT
    assert status_of(service, "t-error") is TaskStatus.ERROR


DEAD = ["t-error", "t-timeout", "t-failed-emails", "t-failed"]  # newest first


def test_dead_letters_filter_lists_failed_timeout_and_error_together(service, viewer):
    add_timeout_and_error(service)
    response = viewer.get(LIST_URL + "?status=dead")
    assert response.status_code == 200
    assert listed(response) == DEAD
    assert response.context["total"] == 4
    html = response.content.decode()
    assert "Tasks 1&ndash;4 of 4, newest first." in html
    assert 'id="re-dead-letters-help"' in html
    assert "re-retry-dead-button" not in html  # a viewer cannot retry
    # Shown with the status choices, selected, and kept by the task name box.
    choices = {f["name"]: f["links"] for f in response.context["filter_choices"]}
    dead = [link for link in choices["status"] if link["label"] == "Dead letters"]
    assert dead == [{"label": "Dead letters", "url": "?status=dead", "selected": True}]
    assert [link["label"] for link in choices["status"] if link["selected"]] == ["Dead letters"]
    assert '<input type="hidden" name="status" value="dead">' in html
    # Combined with the other filters.
    assert listed(viewer.get(LIST_URL + "?status=dead&queue=emails")) == ["t-failed-emails"]
    assert listed(viewer.get(LIST_URL + "?status=dead&queue=dlq")) == ["t-error", "t-timeout"]
    named = viewer.get(LIST_URL + "?status=dead&task_name=contract.hook")
    assert listed(named) == DEAD and named.context["total"] is None
    assert viewer.get(LIST_URL + "?status=dead&queue=emails").context["total"] == 1


def test_summary_links_to_the_dead_letters_with_their_count(service, viewer):
    add_timeout_and_error(service)
    response = viewer.get(LIST_URL)
    summary = response.context["summary"]
    assert summary["dead_letters"] == 4
    assert summary["dead_letters_url"] == "?status=dead"
    html = response.content.decode()
    assert re.search(r'<a href="\?status=dead"[^>]*>Dead letters: 4</a>', html)
    assert 'id="re-dead-letters-help"' not in html  # only on the dead letters' page


def test_dead_letters_pages_keep_the_filter(service, viewer, monkeypatch):
    add_timeout_and_error(service)
    monkeypatch.setattr(pages, "PAGE_SIZE", 3)
    first = viewer.get(LIST_URL + "?status=dead")
    assert listed(first) == DEAD[:3]
    assert first.context["next_url"] == "?status=dead&page=2"
    second = viewer.get(LIST_URL + "?status=dead&page=2")
    assert listed(second) == DEAD[3:]
    assert second.context["next_url"] is None
    assert second.context["previous_url"] == "?status=dead"


def test_select_all_and_retry_on_the_dead_letters_page(service, operator):
    add_timeout_and_error(service)
    url = LIST_URL + "?status=dead"
    page = operator.get(url)
    assert page.content.decode().count('class="action-select"') == 4
    response = operator.post(url, {"action": "retry", "_selected_action": listed(page)})
    assert response.status_code == 302 and response["Location"] == url
    assert message_texts(response) == ["4 tasks retried."]
    assert all(status_of(service, task_id) is TaskStatus.PENDING for task_id in DEAD)
    after = operator.get(url)
    assert listed(after) == [] and after.context["total"] == 0


def test_retry_the_dead_letters_page_button(service, operator, monkeypatch):
    add_timeout_and_error(service)
    monkeypatch.setattr(pages, "PAGE_SIZE", 3)
    url = LIST_URL + "?status=dead"
    html = operator.get(url).content.decode()
    form = re.search(r'<form method="post" id="re-retry-dead">(.*?)</form>', html, re.S)
    assert form is not None
    posted = re.findall(r'name="_selected_action" value="([^"]+)"', form.group(1))
    assert posted == DEAD[:3]  # this page's dead letters
    assert "Retry the 3 dead letters of this page" in form.group(1)
    assert 'name="csrfmiddlewaretoken"' in form.group(1)
    response = operator.post(url, {"action": "retry", "_selected_action": posted})
    assert message_texts(response) == ["3 tasks retried."]
    assert listed(operator.get(url)) == ["t-failed"]  # the next one moved up


# -- search -----------------------------------------------------------------------------------
def test_search_by_exact_task_id_opens_the_task(service, viewer):
    response = viewer.get(LIST_URL, {"q": " t-failed "})
    assert response.status_code == 302
    assert response["Location"] == detail_url("t-failed")


def test_search_for_an_unknown_id_says_so(service, viewer):
    response = viewer.get(LIST_URL, {"q": "t-fail"})  # exact ids only: no prefix match
    assert response.status_code == 200
    assert message_texts(response) == ["No task has the id 't-fail'."]
    assert listed(response) == NEWEST_FIRST


def test_search_by_tag_lists_the_tasks_of_that_tag(service, viewer):
    service.submit("demo.echo", None, task_id="tagged-1", tags=["import", "other"])
    service.submit("demo.echo", None, task_id="tagged-2", tags=["import"], queue="q2")
    service.submit("demo.echo", None, task_id="untagged")
    response = viewer.get(LIST_URL, {"q": "tag:import", "queue": "q2"})
    assert response.status_code == 302
    # the tag becomes a filter of the list, the other filters kept
    assert response["Location"] == LIST_URL + "?queue=q2&tag=import"
    response = viewer.get(LIST_URL, {"tag": "import"})
    assert listed(response) == ["tagged-2", "tagged-1"]
    assert 'value="tag:import"' in response.content.decode()  # the box shows the filter
    assert listed(viewer.get(LIST_URL, {"tag": "import", "queue": "q2"})) == ["tagged-2"]
    assert listed(viewer.get(LIST_URL, {"tag": "nothing"})) == []
    # "tag:" alone drops the filter
    response = viewer.get(LIST_URL, {"q": "tag:", "tag": "import"})
    assert response["Location"] == LIST_URL + "?"


def test_a_tasks_page_shows_its_tags_each_linking_to_its_list(service, viewer):
    service.submit("demo.echo", None, task_id="tagged", tags=["import", "customer:42 & co"])
    service.submit("demo.echo", None, task_id="plain")
    page = viewer.get(detail_url("tagged")).content.decode()
    row = page[page.index('<tr id="re-tags">') :]
    row = row[: row.index("</tr>")]
    assert f'<a href="{LIST_URL}?tag=import"><code>import</code></a>' in row
    assert (
        f'<a href="{LIST_URL}?tag=customer%3A42+%26+co"><code>customer:42 &amp; co</code></a>'
        in row
    )
    plain = viewer.get(detail_url("plain")).content.decode()
    assert (
        '<tr id="re-tags"><th scope="row">Tags</th><td><span class="re-muted">none</span>' in plain
    )


# -- pagination -------------------------------------------------------------------------------
def test_pages_walk_every_task_once_with_previous_and_next(service, viewer, monkeypatch):
    monkeypatch.setattr(pages, "PAGE_SIZE", 3)
    seen: list[str] = []
    url: str | None = LIST_URL
    pages_seen = 0
    while url is not None:
        response = viewer.get(url if url.startswith("/") else LIST_URL + url)
        pages_seen += 1
        seen += listed(response)
        if pages_seen > 1:
            assert response.context["previous_url"] is not None
        url = response.context["next_url"]
    assert pages_seen == 3
    assert seen == NEWEST_FIRST
    last = viewer.get(LIST_URL + "?page=3")
    assert "Tasks 7&ndash;8 of 8" in last.content.decode()
    assert last.context["first_url"] == "?"
    # Past the end: an empty page, not an error.
    assert listed(viewer.get(LIST_URL + "?page=9")) == []
    assert listed(viewer.get(LIST_URL + "?page=bad")) == NEWEST_FIRST[:3]


def test_filtered_pages_keep_the_filter(service, viewer, monkeypatch):
    monkeypatch.setattr(pages, "PAGE_SIZE", 1)
    response = viewer.get(LIST_URL + "?status=FAILED")
    assert listed(response) == ["t-failed-emails"]
    assert response.context["next_url"] == "?status=FAILED&page=2"
    response = viewer.get(LIST_URL + "?status=FAILED&page=2")
    assert listed(response) == ["t-failed"]
    assert response.context["next_url"] is None


# -- detail -----------------------------------------------------------------------------------
def test_detail_shows_json_error_timestamps_worker_and_cancel_flag(service, viewer):
    response = viewer.get(detail_url("t-completed"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "&quot;items&quot;: [\n    &quot;a&quot;,\n    &quot;b&quot;\n  ]" in html  # pretty
    assert "&quot;charged&quot;: 12.5" in html
    assert "re-status-completed" in html
    task = service.get_task("t-completed")
    assert task.worker_id and task.worker_id in html
    assert task.finished_at.strftime("%Y-%m-%d %H:%M:%S") in html

    failed = viewer.get(detail_url("t-failed")).content.decode()
    assert "Traceback (most recent call last)" in failed
    assert "ValueError: boom in t-failed" in failed

    service.cancel_task("t-running")
    running = viewer.get(detail_url("t-running")).content.decode()
    assert "cancel requested" in running
    assert re.search(r"Cancel requested</th><td>yes</td>", running)
    assert "worker-a" in running


def test_detail_shows_the_attempt_timeout_its_own_or_its_handler_s(service, viewer):
    service.submit("contract.hook", None, task_id="t-limited", attempt_timeout=90)
    service.submit("contract.timed", None, task_id="t-decorated", attempt_timeout=None)
    service.storage.enqueue([new_task("t-bare", "contract.timed", None, service.clock.now())])

    def shown(task_id: str) -> str:
        html = viewer.get(detail_url(task_id)).content.decode()
        found = re.search(
            r'id="re-attempt-timeout"><th scope="row">Attempt timeout</th>'
            r"<td>(.*?)</td>",
            html,
        )
        assert found, html
        return found.group(1)

    assert shown("t-limited") == "1 min 30 s per attempt"
    assert shown("t-decorated") == "300 ms per attempt"  # stored from the handler at submit
    assert shown("t-bare") == "300 ms per attempt (its handler&#x27;s)"
    assert shown("t-completed") == '<span class="re-muted">none</span>'


def test_detail_of_an_unknown_task_goes_back_to_the_list(service, viewer):
    response = viewer.get(detail_url("missing"))
    assert response.status_code == 302 and response["Location"] == LIST_URL
    assert message_texts(response) == ["No task has the id 'missing'."]


def test_detail_url_of_an_id_with_odd_characters(service, viewer):
    odd = "order/12_34?x=1&y#z"
    service.submit("contract.hook", None, task_id=odd, delay_millis=3_600_000)
    response = viewer.get(detail_url(odd))
    assert response.status_code == 200
    assert response.context["task"].task_id == odd
    # The bare URL (as the admin's own) leads to the page.
    bare = viewer.get(LIST_URL + quote(odd) + "/")
    assert bare.status_code == 302 and bare["Location"] == detail_url(odd)


# -- actions ----------------------------------------------------------------------------------
def test_retry_selected_says_how_many_changed_and_why_others_were_skipped(service, operator):
    selected = ["t-failed", "t-failed-emails", "t-cancelled", "t-completed", "t-running", "nope"]
    response = operator.post(
        LIST_URL + "?status=FAILED", {"action": "retry", "_selected_action": selected}
    )
    assert response.status_code == 302 and response["Location"] == LIST_URL + "?status=FAILED"
    assert message_texts(response) == [
        "3 tasks retried; 3 skipped: 1 COMPLETED cannot be retried, "
        "1 RUNNING cannot be retried, 1 not found."
    ]
    for task_id in ("t-failed", "t-failed-emails", "t-cancelled"):
        assert status_of(service, task_id) is TaskStatus.PENDING
    assert status_of(service, "t-completed") is TaskStatus.COMPLETED


def test_cancel_selected_goes_through_the_service_and_fires_signals(service, operator):
    selected = ["t-created", "t-later", "t-pending", "t-running", "t-completed", "t-failed"]
    with recording(signals.task_cancelled) as cancelled:
        response = operator.post(LIST_URL, {"action": "cancel", "_selected_action": selected})
    assert message_texts(response) == [
        "3 tasks cancelled, cancel requested for 1 task running; 2 skipped: "
        "1 COMPLETED cannot be cancelled, 1 FAILED cannot be cancelled."
    ]
    assert sorted(c["task_id"] for c in cancelled.calls) == ["t-created", "t-later", "t-pending"]
    for task_id in ("t-created", "t-later", "t-pending"):
        assert status_of(service, task_id) is TaskStatus.CANCELLED
    running = service.get_task("t-running")
    assert (running.status, running.cancel_requested) == (TaskStatus.RUNNING, True)
    # Asking again for the running task: nothing more to do, and said so.
    again = operator.post(LIST_URL, {"action": "cancel", "_selected_action": ["t-running"]})
    assert message_texts(again)[-1] == (  # the first message was never shown: still stored
        "0 tasks cancelled; 1 skipped: 1 RUNNING with cancel already requested."
    )


def test_all_changed_is_a_success_message(service, operator):
    response = operator.post(LIST_URL, {"action": "retry", "_selected_action": ["t-failed"]})
    (message,) = list(get_messages(response.wsgi_request))
    assert (str(message), message.level_tag) == ("1 task retried.", "success")


def test_action_without_selection_or_with_unknown_action_changes_nothing(service, operator):
    response = operator.post(LIST_URL, {"action": "retry"})
    assert message_texts(response) == ["Select the tasks to act on first: nothing was changed."]
    response = operator.post(LIST_URL, {"action": "drop", "_selected_action": ["t-failed"]})
    assert message_texts(response)[-1] == "Choose an action: retry or cancel."
    assert status_of(service, "t-failed") is TaskStatus.FAILED


def test_detail_page_buttons_retry_and_cancel_one_task(service, operator):
    page = operator.get(detail_url("t-failed")).content.decode()
    assert 'id="re-retry"' in page and 'id="re-cancel"' not in page
    response = operator.post(detail_url("t-failed"), {"action": "retry"})
    assert response.status_code == 302 and response["Location"] == detail_url("t-failed")
    assert message_texts(response) == ["1 task retried."]
    assert status_of(service, "t-failed") is TaskStatus.PENDING

    page = operator.get(detail_url("t-pending")).content.decode()
    assert 'id="re-cancel"' in page and 'id="re-retry"' not in page
    with recording(signals.task_cancelled) as cancelled:
        response = operator.post(detail_url("t-pending"), {"action": "cancel"})
    assert message_texts(response) == ["1 task cancelled."]
    assert [c["task_id"] for c in cancelled.calls] == ["t-pending"]
    assert "Request cancel" in operator.get(detail_url("t-running")).content.decode()
    completed = operator.get(detail_url("t-completed")).content.decode()
    assert "No action applies to a COMPLETED task" in completed


# -- the superuser (every role's cells: tests/integration/test_permissions.py) ----------------
def test_nothing_can_be_added_edited_or_deleted(service, client):
    client.force_login(make_user("root", superuser=True))
    index = client.get(reverse("admin:index")).content.decode()
    assert LIST_URL in index
    assert reverse("admin:django_reliable_executor_reliabletask_changelist") + "add/" not in index
    for name, args in (("add", []), ("delete", ["t-failed"]), ("history", ["t-failed"])):
        with pytest.raises(NoReverseMatch):
            reverse(f"admin:django_reliable_executor_reliabletask_{name}", args=args)
    # A superuser operates without being granted anything.
    response = client.post(detail_url("t-failed"), {"action": "retry"})
    assert message_texts(response) == ["1 task retried."]


@pytest.mark.parametrize("backend", admin_params(["default"]))
def test_actions_need_the_csrf_token(backend, client):
    from django.test import Client

    with executor_on(backend) as service:
        service.submit("contract.hook", None, task_id="c", delay_millis=3_600_000)
        strict = Client(enforce_csrf_checks=True)
        strict.force_login(make_user("op", "view_reliabletask", "operate_reliabletask"))
        response = strict.post(LIST_URL, {"action": "cancel", "_selected_action": ["c"]})
        assert response.status_code == 403
        assert status_of(service, "c") is TaskStatus.CREATED


@pytest.mark.parametrize("backend", admin_params())
def test_empty_store(backend, viewer):
    with executor_on(backend):
        response = viewer.get(LIST_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "No tasks yet." in html
    assert "no worker holds the master lock" in html
    assert "none: no task is due and unclaimed" in html
    assert response.context["summary"]["workers"] == []


@pytest.mark.parametrize("backend", admin_params(["default"]))
def test_an_unreachable_redis_gives_a_503_page_not_a_crash(backend, operator):
    from django.test import override_settings

    # Nothing listens on port 9 (discard): every call fails to connect.
    down = {"STORAGE": "redis", "REDIS_URL": "redis://127.0.0.1:9/0", "KEY_PREFIX": "test-down"}
    with override_settings(RELIABLE_EXECUTOR=down):
        for url in (LIST_URL, detail_url("t-1")):
            response = operator.get(url)
            assert response.status_code == 503
            assert "The task storage cannot be reached" in response.content.decode()
        response = operator.post(LIST_URL, {"action": "retry", "_selected_action": ["a", "b"]})
    assert response.status_code == 302
    assert message_texts(response)[-1].startswith(
        "0 tasks retried; 2 skipped: 2 not attempted. Stopped: Redis at"
    )


def test_retry_of_a_timed_out_task_whose_handler_still_runs_says_where_it_runs(service, operator):
    service.submit("demo.echo", None, task_id="late", max_duration_millis=1, queue="late")
    claim_and_start(service.storage, "w-late", queue="late")
    time.sleep(0.01)
    assert [t.task.task_id for t in service.storage.expire_overdue(10)] == ["late"]
    response = operator.post(LIST_URL, {"action": "retry", "_selected_action": ["late"]})
    [text] = message_texts(response)
    assert text.startswith("0 tasks retried; 1 skipped: 1 its previous attempt is still running")
    assert "on worker w-late" in text
    assert status_of(service, "late") is TaskStatus.TIMEOUT


def test_summary_shows_the_use_of_each_rate_limit(service, viewer):
    """demo.rated has rate_limit="5/s": two claimed starts and its limit in the summary."""
    for key in ("a", "b"):
        service.submit("demo.rated", {}, rate_key=key)
    claims = service.storage.claim("w-1", ["default"], 10, 60, rate_limits=rate_limits(), start=10)
    assert sum(c.task.task_name == "demo.rated" for c in claims) == 2
    response = viewer.get(LIST_URL)
    [use] = [u for u in response.context["summary"]["rate_limits"] if u.task_name == "demo.rated"]
    assert (str(use.limit), use.started, use.busiest, use.keys) == ("5/s", 2, 1, 2)
    html = response.content.decode()
    assert 'id="re-rate-limits"' in html and 'data-task-name="demo.rated"' in html


def test_summary_shows_the_busiest_concurrency_keys(service, viewer):
    """demo.keyed has max_concurrency_per_key=2: its keys' held tasks in the summary."""
    for key in ("acme", "acme", "acme", "globex"):
        service.submit("demo.keyed", {}, concurrency_key=key)
    claims = service.storage.claim("w-1", ["default"], 10, 60, key_limits=key_limits())
    assert sum(c.task.task_name == "demo.keyed" for c in claims) == 3
    response = viewer.get(LIST_URL)
    uses = response.context["summary"]["key_limits"]
    assert {u.task_name for u in uses} == set(key_limits())  # every name with a per-key cap
    [use] = [u for u in uses if u.task_name == "demo.keyed"]
    assert (use.task_name, use.cap, use.held, use.keys) == ("demo.keyed", 2, 3, 2)
    assert use.busiest == (("acme", 2), ("globex", 1))
    html = response.content.decode()
    assert 'id="re-key-limits"' in html and 'data-task-name="demo.keyed"' in html
    assert '<span class="re-key" data-key="acme"><code>acme</code> 2/2</span>' in html


def test_list_and_detail_show_a_tasks_concurrency_key(service, viewer):
    """demo.keyed (max_concurrency_per_key=2) and demo.fair_keyed (2 per key, round robin): the
    task's key on its page, with what its handler does with it, and under its name in the list."""
    service.submit("demo.keyed", {}, task_id="k-acme", concurrency_key="acme <co>")
    service.submit("demo.fair_keyed", {}, task_id="k-fair", concurrency_key="globex")

    def key_row(task_id: str) -> str:
        html = viewer.get(detail_url(task_id)).content.decode()
        found = re.search(r'<tr id="re-concurrency-key">(.*?)</tr>', html)
        assert found, html
        return found.group(1)

    assert key_row("k-acme") == (
        '<th scope="row">Concurrency key</th><td><code>acme &lt;co&gt;</code> <span '
        'class="re-muted">(at most 2 tasks of this name and key run at once)</span></td>'
    )
    assert "(at most 2 tasks of this name and key run at once; the keys take turns)" in key_row(
        "k-fair"
    )
    assert key_row("t-completed").endswith('<td><span class="re-muted">none</span></td>')

    html = viewer.get(LIST_URL).content.decode()
    row = re.search(r'<tr data-task-id="k-acme".*?</tr>', html, re.S).group(0)
    shown = '<span class="re-muted re-key-of" title="concurrency_key">key <code>acme &lt;co&gt;'
    assert shown in row
    plain = re.search(r'<tr data-task-id="t-completed".*?</tr>', html, re.S).group(0)
    assert "re-key-of" not in plain


def test_list_and_detail_show_a_tasks_rate_key(service, viewer):
    """demo.rated (rate_limit="5/s") and demo.fair (round robin, no limit): the task's rate key
    on its page, with what its handler does with it, and under its name in the list unless it
    is the task's concurrency key too (shown once, as its key)."""
    service.submit("demo.rated", {}, task_id="r-acme", rate_key="acme <co>")
    service.submit("demo.fair", {}, task_id="r-fair", rate_key="globex")
    service.submit("demo.fair_keyed", {}, task_id="r-both", concurrency_key="k", rate_key="k")

    def rate_row(task_id: str) -> str:
        html = viewer.get(detail_url(task_id)).content.decode()
        found = re.search(r'<tr id="re-rate-key">(.*?)</tr>', html)
        assert found, html
        return found.group(1)

    assert rate_row("r-acme") == (
        '<th scope="row">Rate key</th><td><code>acme &lt;co&gt;</code> <span '
        'class="re-muted">(at most 5 tasks of this name and key start in any second)</span></td>'
    )
    assert rate_row("r-fair").endswith(
        '<code>globex</code> <span class="re-muted">(the keys take turns)</span></td>'
    )
    # Its turns are its concurrency key's (on that row); its name has no rate limit.
    assert rate_row("r-both").endswith("<td><code>k</code></td>")
    assert rate_row("t-completed").endswith('<td><span class="re-muted">none</span></td>')

    html = viewer.get(LIST_URL).content.decode()
    rows = {
        task_id: re.search(rf'<tr data-task-id="{task_id}".*?</tr>', html, re.S).group(0)
        for task_id in ("r-acme", "r-both", "t-completed")
    }
    shown = '<span class="re-muted re-key-of" title="rate_key">rate key <code>acme &lt;co&gt;'
    assert shown in rows["r-acme"]
    assert 'title="rate_key"' not in rows["r-both"]
    assert 'title="concurrency_key">key <code>k</code>' in rows["r-both"]
    assert "re-key-of" not in rows["t-completed"]


# -- progress -------------------------------------------------------------------------------
def test_list_and_detail_show_the_progress_bar(service, viewer):
    service.submit("demo.echo", None, task_id="p-bar", queue="progress")
    claim = claim_and_start(service.storage, queue="progress")
    reported = make_progress(3, 10, "copying <files>", service.clock.now())
    assert service.storage.record_progress([(claim, reported)]) == 1

    response = viewer.get(LIST_URL)
    rows = {row.task.task_id: row for row in response.context["rows"]}
    assert (rows["p-bar"].percent, rows["p-bar"].progress) == (30, "3 of 10 (30%): copying <files>")
    assert (rows["t-created"].percent, rows["t-created"].progress) == (None, "")
    html = response.content.decode()
    row = re.search(r'<tr data-task-id="p-bar".*?</tr>', html, re.S).group(0)
    assert '<progress max="100" value="30" aria-label="30% done">' in row
    assert "copying &lt;files&gt;" in row  # escaped

    detail = viewer.get(detail_url("p-bar")).content.decode()
    assert '<progress max="100" value="30"' in detail
    assert "3 of 10 (30%): copying &lt;files&gt;" in detail
    before = viewer.get(detail_url("t-created")).content.decode()
    assert re.search(
        r'<tr id="re-progress"><th scope="row">Progress</th><td>\s*<span class="re-muted">', before
    )
