"""The admin's task detail links a task to its dependencies and its dependents, on every storage."""

from __future__ import annotations

from django.contrib.messages import get_messages

from django_reliable_executor import TaskSubmitRequest
from django_reliable_executor.admin import task_detail
from django_reliable_executor.core.states import TaskStatus
from tests.support.admin_support import (
    LIST_URL,
    boom,
    detail_url,
    make_user,
    run_one,
)
from tests.support.contract_support import HOOKS

HOOK = "contract.hook"


def test_detail_links_dependencies_and_dependents(service, viewer):
    service.submit(HOOK, None, task_id="d-order")
    service.submit(HOOK, None, task_id="d-charge", depends_on=["d-order", "t-completed"])
    service.submit(HOOK, None, task_id="d-email", depends_on=["d-charge"])

    charge = viewer.get(detail_url("d-charge")).content.decode()
    assert '<th scope="row">Depends on</th>' in charge
    assert f'href="{detail_url("d-order")}" class="re-dependency"' in charge
    assert f'href="{detail_url("t-completed")}" class="re-dependency"' in charge
    assert '<code>d-order</code></a> CREATED <span class="re-muted">(awaited)</span>' in charge
    assert "<code>t-completed</code></a> COMPLETED</td>" in charge
    assert f'href="{detail_url("d-email")}" class="re-dependent"' in charge
    assert "when its dependencies end" in charge

    order = viewer.get(detail_url("d-order")).content.decode()
    assert f'href="{detail_url("d-charge")}" class="re-dependent"' in order
    assert "re-dependency" not in order

    plain = viewer.get(detail_url("t-created")).content.decode()
    assert 'id="re-dependencies"' not in plain


def test_retrying_dependents_says_why_one_whose_dependency_failed_is_skipped(service, client):
    client.force_login(make_user("operator", "view_reliabletask", "operate_reliabletask"))
    service.submit(HOOK, None, task_id="d-fails", retry_limit=0, queue="deps")
    service.submit(HOOK, None, task_id="d-after-failure", depends_on=["d-fails"], queue="deps")
    service.submit(HOOK, None, task_id="d-slow", delay_millis=600_000, queue="deps")
    service.submit(HOOK, None, task_id="d-after-slow", depends_on=["d-slow"], queue="deps")
    HOOKS["d-fails"] = boom
    assert run_one(service, "deps") is TaskStatus.FAILED
    assert service.cancel_task("d-after-slow")
    response = client.post(
        LIST_URL, {"action": "retry", "_selected_action": ["d-after-failure", "d-after-slow"]}
    )
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "1 task retried; 1 skipped: 1 its dependency d-fails ended FAILED, and it runs only "
        "after its dependencies completed (on_dependency_failure='cancel'); retry the "
        "dependency first."
    ]
    assert service.get_task("d-after-failure").status is TaskStatus.CANCELLED
    waiting = service.get_task("d-after-slow")
    assert waiting.status is TaskStatus.CREATED and waiting.waiting_for == ("d-slow",)


def test_a_task_with_many_dependents_lists_the_first_ones_and_counts_the_rest(
    service, viewer, monkeypatch
):
    # The bound made small (5) so that 8 dependents prove it fast; the page reads and shows
    # the first ones only, then how many more, with a link to the workflow graph.
    monkeypatch.setattr(task_detail, "DEPENDENTS_SHOWN", 5)
    service.submit(HOOK, None, task_id="m-root")
    service.submit_many(
        [
            TaskSubmitRequest(HOOK, None, task_id=f"m-dep-{i}", depends_on=["m-root"])
            for i in range(8)
        ]
    )
    html = viewer.get(detail_url("m-root")).content.decode()
    assert html.count('class="re-dependent"') == 5
    for shown in ("m-dep-0", "m-dep-4"):
        assert f'href="{detail_url(shown)}" class="re-dependent"' in html
    assert "m-dep-5" not in html.split('id="re-graph"')[0]
    assert 'and 3 more (see the <a href="#re-graph">workflow graph</a>)' in html
