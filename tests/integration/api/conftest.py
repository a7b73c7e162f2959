"""The API tests' fixtures: the module executor on each storage (``service``) and an operator
logged in with a session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client

from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.admin_support import admin_params
from tests.support.api_support import (
    api_executor,
    login,
)


@pytest.fixture(params=admin_params())
def service(request: pytest.FixtureRequest) -> Iterator[ReliableExecutor]:
    with api_executor(request.param) as service:
        yield service


@pytest.fixture
def operator(client: Client) -> Client:
    return login(client, "view_reliabletask", "add_reliabletask", "operate_reliabletask")
