"""Unique tasks across processes: racing submits of one key store exactly one task."""

from __future__ import annotations

import pytest

from tests.conftest import require
from tests.support.processes import Backend, service_for
from tests.support.racers import race

RACERS = 8


@pytest.mark.parametrize("in_transaction", [None, 0.3], ids=["autocommit", "in_transaction"])
def test_racing_processes_store_one_task_per_unique_key(
    alias, key_prefix, tmp_path, in_transaction
):
    """Eight processes submit one unique key at once (released together from a barrier):
    one task is stored and every submit returns it. ``autocommit``: the key is held by a
    cancelled task, so each racer would take it over. ``in_transaction``: a fresh key, each
    racer submitting inside its own atomic() held open a while, so the others meet an
    uncommitted key (database: they wait for its outcome; Redis: the writes happen at
    commit)."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    submit = {"task_name": "demo.echo", "parameter": {"order": 7}, "unique_for": 300}
    previous = None
    if in_transaction is None:
        previous = service.submit(submit["task_name"], submit["parameter"], unique_for=300)
        assert service.cancel_task(previous.task_id)
    else:
        submit["in_transaction"] = in_transaction
    ids = race(backend, RACERS, tmp_path, submit)
    stored = [
        task
        for task in service.list_tasks(task_name="demo.echo", limit=100)
        if previous is None or task.task_id != previous.task_id
    ]
    assert len(stored) == 1, [t.task_id for t in stored]
    if alias == "redis" and in_transaction is not None:
        # Inside atomic() Redis writes at commit: a submit returns the key's holder as it
        # stood when it was made, which a transaction committing meanwhile may replace.
        assert stored[0].task_id in ids
    else:
        assert ids == {stored[0].task_id}
