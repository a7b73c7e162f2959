"""The command tests' fixtures: the command's executor on the backend under test (``live``) and
a second service over the same store on the real clock (``now_ex``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from django_reliable_executor.core.clock import system_clock
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.service.reliable_executor import executor as module_executor
from tests.conftest import REDIS_URL


@pytest.fixture
def live(alias: str, key_prefix: str) -> Iterator[ReliableExecutor]:
    """The module-level executor call_command uses, pointed at the backend under test."""
    if alias == "redis":
        setting = {"STORAGE": "redis", "REDIS_URL": REDIS_URL, "KEY_PREFIX": key_prefix}
    else:
        setting = {"DATABASE_ALIAS": alias}
    with override_settings(RELIABLE_EXECUTOR=setting):
        yield module_executor
        module_executor.storage.close()


@pytest.fixture
def now_ex(live, make_storage) -> ReliableExecutor:
    """A second service over the same tasks, on the real clock (like the command's)."""
    return ReliableExecutor(make_storage(), clock=system_clock)
