"""The database storage built with defaults: what it reads from the settings when it needs it."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import override_settings

from django_reliable_executor import TaskStatus
from django_reliable_executor.service import ReliableExecutor
from django_reliable_executor.storage.database import DatabaseStorage

from .conftest import DB_ALIASES, db_params, require
from .contract_support import claim_and_start


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_storage_without_a_backoff_cap_reads_it_from_the_settings(alias):
    """Built without backoff_cap_millis (as a plain DatabaseStorage(alias) is), recording a
    retryable failure takes the cap from DEFAULT_RETRY_BACKOFF_MAX."""
    require(alias)
    storage = DatabaseStorage(alias=alias)
    executor = ReliableExecutor(storage)
    executor.submit(
        "demo.echo", {}, task_id="no-cap", retry_interval=3_600_000, retry_backoff="exponential"
    )
    claim = claim_and_start(storage)
    with override_settings(RELIABLE_EXECUTOR={"DEFAULT_RETRY_BACKOFF_MAX": 1000}):
        assert storage.backoff_cap_millis == 1000
        transition = storage.fail(claim, "boom", retryable=True)
    assert transition is not None and transition.status is TaskStatus.PENDING
    info = executor.get_task("no-cap")
    assert info.status is TaskStatus.PENDING
    # Capped at 1 s rather than an hour from now.
    assert info.run_at - claim.task.started_at <= dt.timedelta(seconds=5)
