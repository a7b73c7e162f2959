"""Unique submits over 3 Redis shards whose key's home is another shard than the task's: settled
as the unsharded store settles them (tests/contract/test_contract_unique.py, which runs sharded
only with TEST_REDIS_SHARDS), each request as if submitted alone after the ones before it."""

from __future__ import annotations

import pytest

from django_reliable_executor import InvalidDependencyError, TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.uniqueness import unique_digest
from django_reliable_executor.storage.redis.sharding import directory_of, unique_home

from .conftest import S0, S1, SHARDS, step

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])
KEY = unique_digest("demo.echo", "k", {})


def test_the_key_used_is_of_another_home_than_the_queues():
    assert unique_home(KEY, SHARDS) == 2
    assert (directory_of("plain", SHARDS), directory_of("x", SHARDS)) == (2, 0)


@pytest.mark.parametrize(
    ("task_id", "first", "again"),
    [
        ("plain", S1, S1),  # stored on shard 1 off its directory (2), which names shard 1
        ("x", S0, S0),  # stored on its directory shard (0)
        ("x", S1, S0),  # stored on shard 1, submitted again to its directory shard (0)
    ],
)
@pytest.mark.parametrize("held", [True, False])
def test_an_existing_id_answers_whatever_its_key_and_takes_none(
    executor, storage, task_id, first, again, held
):
    stored = executor.submit("demo.echo", {}, task_id=task_id, queue=first)
    holder = (
        executor.submit("demo.echo", {}, queue=S0, unique_for=60, unique_key="k") if held else None
    )
    answer = executor.submit(
        "demo.echo", {}, task_id=task_id, queue=again, unique_for=60, unique_key="k"
    )
    assert answer.task_id == task_id and answer.queue == first
    assert executor.get_task(task_id) == stored
    if holder is None:
        assert storage.client.get(storage.prefixes[2] + "u:" + KEY) is None  # not taken
        holder = executor.submit("demo.echo", {}, queue=S0, unique_for=60, unique_key="k")
        assert holder.task_id != task_id
    assert storage.unique_holder(KEY) == executor.get_task(holder.task_id)


def unique(task_id: str, **options) -> TaskSubmitRequest:
    return step(task_id, S1, unique_for=60, unique_key="k", **options)


def test_a_task_cancelled_at_once_frees_its_key_for_later_requests_and_their_dependents(
    executor, storage
):
    executor.submit("demo.echo", {}, task_id="gone", queue=S0)
    assert executor.cancel_task("gone")
    answers = executor.submit_many(
        [
            unique("doomed", depends_on=["gone"]),
            unique("kept"),
            unique("again"),
            step("after", S1, depends_on=["kept"]),
        ]
    )
    assert [(a.task_id, a.status) for a in answers] == [
        ("doomed", TaskStatus.CANCELLED),
        ("kept", TaskStatus.CREATED),
        ("kept", TaskStatus.CREATED),
        ("after", TaskStatus.CREATED),
    ]
    assert executor.get_task("after").waiting_for == ("kept",)
    assert storage.unique_holder(KEY) == executor.get_task("kept")


def test_a_split_call_is_refused_whole_for_a_missing_dependency(executor, storage):
    executor.submit("demo.echo", {}, task_id="gone", queue=S0)
    assert executor.cancel_task("gone")
    with pytest.raises(InvalidDependencyError, match="'late' names tasks that do not exist"):
        executor.submit_many(
            [
                unique("doomed", depends_on=["gone"]),
                unique("kept"),
                step("late", S1, depends_on=["nowhere"]),
            ]
        )
    assert storage.get_many(["doomed", "kept", "late"]) == {}
    assert storage.client.get(storage.prefixes[2] + "u:" + KEY) is None


def test_a_split_call_is_refused_whole_for_a_dependency_on_a_request_a_live_holder_answers(
    executor, storage
):
    """Split at ``kept`` (``doomed`` before it, of its key, is cancelled as it is stored), the
    call is checked whole before its first half is written: ``dup``, answered by the live task
    holding its key, is not stored, so ``after`` names a task that does not exist. Nothing of
    the call is stored, and no key taken (all or nothing, as on the databases)."""
    executor.submit("demo.echo", {}, task_id="gone", queue=S0)
    assert executor.cancel_task("gone")
    holder = executor.submit("demo.echo", {}, queue=S0, unique_for=60, unique_key="h")
    with pytest.raises(InvalidDependencyError, match="'after' names tasks that do not exist"):
        executor.submit_many(
            [
                step("dup", S1, unique_for=60, unique_key="h"),  # answered by holder
                unique("doomed", depends_on=["gone"]),
                unique("kept"),
                step("after", S1, depends_on=["dup"]),
            ]
        )
    assert storage.get_many(["dup", "doomed", "kept", "after"]) == {}
    assert storage.client.get(storage.prefixes[2] + "u:" + KEY) is None
    h = unique_digest("demo.echo", "h", {})
    assert storage.unique_holder(h) == executor.get_task(holder.task_id)
    # The same call without the refused request is stored as it would be alone.
    answers = executor.submit_many(
        [
            step("dup", S1, unique_for=60, unique_key="h"),
            unique("doomed", depends_on=["gone"]),
            unique("kept"),
            step("after", S1, depends_on=["kept"]),
        ]
    )
    assert [a.task_id for a in answers] == [holder.task_id, "doomed", "kept", "after"]
    assert storage.unique_holder(KEY) == executor.get_task("kept")
