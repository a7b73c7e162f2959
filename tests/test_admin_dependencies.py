"""The admin's task detail links a task to its dependencies and its dependents, on every storage."""

from __future__ import annotations

import pytest

from tests.admin_support import admin_params, detail_url, executor_on, make_user, populate

HOOK = "contract.hook"


@pytest.fixture(params=admin_params())
def service(request: pytest.FixtureRequest):
    with executor_on(request.param) as service:
        populate(service)
        yield service


@pytest.fixture
def viewer(client):
    client.force_login(make_user("viewer", "view_reliabletask"))
    return client


def test_detail_links_dependencies_and_dependents(service, viewer):
    service.submit(HOOK, None, task_id="d-order")
    service.submit(HOOK, None, task_id="d-charge", depends_on=["d-order", "t-completed"])
    service.submit(HOOK, None, task_id="d-email", depends_on=["d-charge"])

    charge = viewer.get(detail_url("d-charge")).content.decode()
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
