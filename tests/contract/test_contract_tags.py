"""Tags (the submit option ``tags``): stored with the task and read back as TaskInfo.tags,
found by ``list_tasks(tag=...)`` newest first, refused whole when bad (submit and submit_many
store nothing), and their index entries purged with the task on every storage."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import connections

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.exceptions import InvalidTaskOptionError
from django_reliable_executor.models import ReliableTaskTag
from tests.support.contract_support import claim_one, run_claim
from tests.support.redis_support import index_problems


def tag_entries(alias, storage) -> int:
    """How many tag index entries the storage holds: rows of the tag table, or members of
    every ``tag:`` set (of every shard) on Redis."""
    if alias == "redis":
        client = storage.client
        return sum(
            client.zcard(key)
            for prefix in storage.prefixes
            for key in client.scan_iter(match=prefix + "tag:*")
        )
    return ReliableTaskTag.objects.using(alias).count()


def tag_keys(storage) -> list:
    return [
        key for prefix in storage.prefixes for key in storage.client.scan_iter(prefix + "tag:*")
    ]


def test_tags_are_stored_folded_and_read_back(executor, alias, storage, clock):
    info = executor.submit("demo.echo", 1, task_id="t1", tags=["import", "customer:42", "import"])
    assert info.tags == ("import", "customer:42")  # duplicates dropped, the order kept
    assert executor.get_task("t1").tags == ("import", "customer:42")
    executor.submit("demo.echo", 2, task_id="plain")
    assert executor.get_task("plain").tags == ()
    [listed] = executor.list_tasks(tag="customer:42")
    assert listed.task_id == "t1"
    assert listed.tags == ("import", "customer:42")
    assert storage.get_many(["t1"])["t1"].tags == ("import", "customer:42")
    many = executor.submit_many(
        [
            TaskSubmitRequest("demo.echo", 3, task_id="t2", tags=("x",)),
            TaskSubmitRequest("demo.echo"),
        ]
    )
    assert [task.tags for task in many] == [("x",), ()]
    assert executor.get_task("t2").tags == ("x",)
    if alias == "redis":  # each task in its tags' sets, scored by creation, and no stray entry
        assert index_problems(storage) == []


def test_list_by_tag_returns_only_its_tasks_newest_first(executor, storage, clock):
    for task_id, tags in (("a", ["import"]), ("b", ["export"]), ("c", ["import", "b"])):
        queue = "first" if task_id == "a" else "default"
        executor.submit("demo.echo", None, task_id=task_id, tags=tags, queue=queue)
        clock.advance(1)
    executor.submit("demo.echo", None, task_id="d")
    assert [t.task_id for t in executor.list_tasks(tag="import")] == ["c", "a"]
    assert [t.task_id for t in executor.list_tasks(tag="export")] == ["b"]
    assert executor.list_tasks(tag="nothing") == []
    assert executor.list_tasks(tag="Import") == []  # compared exactly
    assert [t.task_id for t in executor.list_tasks(tag="import", limit=1, offset=1)] == ["a"]
    # with the other filters: a finished one, by status and name
    assert run_claim(executor, claim_one(storage, queue="first")) is TaskStatus.COMPLETED
    assert [t.task_id for t in executor.list_tasks(tag="import", status="COMPLETED")] == ["a"]
    assert [t.task_id for t in executor.list_tasks(tag="import", status="CREATED")] == ["c"]
    assert executor.list_tasks(tag="import", task_name="demo.other") == []
    assert executor.list_tasks(tag="x" * 65) == []  # no task can have it
    with pytest.raises(ValueError, match="tag"):
        executor.list_tasks(tag=5)


@pytest.mark.parametrize(
    "tags",
    [
        "import",  # a string, not a list
        [""],
        ["x" * 65],
        [5],
        ["nul\x00"],
        [f"t{n}" for n in range(21)],
        {"a"},
    ],
    ids=["string", "empty", "too-long", "not-text", "nul", "too-many", "set"],
)
def test_bad_tags_are_refused_naming_the_field_and_store_nothing(seeded, alias, storage, tags):
    before = tag_entries(alias, storage)
    with pytest.raises(InvalidTaskOptionError) as raised:
        seeded.submit("demo.echo", None, task_id="bad", tags=tags)
    assert raised.value.field == "tags"
    with pytest.raises(InvalidTaskOptionError) as raised:
        seeded.submit_many(
            [
                TaskSubmitRequest("demo.echo", None, task_id="good", tags=["fine"]),
                TaskSubmitRequest("demo.echo", None, task_id="bad", tags=tags),
            ]
        )
    assert raised.value.field == "tags"
    assert seeded.get_task("bad") is None
    assert seeded.get_task("good") is None
    assert [t.task_id for t in seeded.list_tasks()] == ["existing"]
    assert tag_entries(alias, storage) == before


def test_twenty_tags_of_64_characters_are_taken(executor):
    tags = [f"{n:02d}" + "x" * 62 for n in range(20)]
    assert executor.submit("demo.echo", None, task_id="full", tags=tags).tags == tuple(tags)
    assert executor.get_task("full").tags == tuple(tags)


def test_the_purge_removes_the_tag_index_entries(executor, alias, storage, clock):
    executor.submit("demo.echo", None, task_id="gone", tags=["import", "gone-only"])
    executor.submit("demo.echo", None, task_id="kept", queue="other", tags=["import"])
    assert run_claim(executor, claim_one(storage)) is TaskStatus.COMPLETED
    clock.advance(10)
    assert run_claim(executor, claim_one(storage, queue="other")) is TaskStatus.COMPLETED
    assert tag_entries(alias, storage) == 3
    assert storage.purge_finished(clock.now() - dt.timedelta(seconds=5), 10) == 1
    assert executor.get_task("gone") is None
    assert [t.task_id for t in executor.list_tasks(tag="import")] == ["kept"]
    assert executor.list_tasks(tag="gone-only") == []
    assert tag_entries(alias, storage) == 1
    if alias == "redis":
        assert len(tag_keys(storage)) == 1  # the emptied set is gone
    clock.advance(10)
    assert storage.purge_finished(clock.now(), 10) == 1
    assert tag_entries(alias, storage) == 0
    if alias == "redis":
        assert tag_keys(storage) == []
        assert index_problems(storage) == []
    else:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM reliable_executor_task_tag")
            assert cursor.fetchone()[0] == 0
    # the same id submitted again has only its new tags
    executor.submit("demo.echo", None, task_id="gone", tags=["again"])
    assert executor.get_task("gone").tags == ("again",)
    assert executor.list_tasks(tag="import") == []


def test_a_claim_carries_the_tags(executor, alias, storage):
    executor.submit("demo.echo", None, task_id="c", tags=["import"])
    claim = claim_one(storage)
    assert claim.task.tags == ("import",)


def test_batch_members_and_callbacks_keep_their_tags(executor, alias, storage):
    executor.submit_batch(
        [TaskSubmitRequest("contract.hook", {"i": 0}, task_id="m0", tags=["batch-run"])],
        batch_id="b",
        on_complete=TaskSubmitRequest("contract.hook", None, task_id="done", tags=["report"]),
    )
    assert executor.get_task("m0").tags == ("batch-run",)
    assert run_claim(executor, claim_one(storage)) is TaskStatus.COMPLETED
    # the callback, stored when the batch finished, with the tags it was given
    assert executor.get_task("done").tags == ("report",)
    assert [t.task_id for t in executor.list_tasks(tag="report")] == ["done"]
    assert [t.task_id for t in executor.list_tasks(tag="batch-run", batch_id="b")] == ["m0"]
    assert executor.list_tasks(tag="report", batch_id="other") == []
    if alias == "redis":
        assert index_problems(storage) == []
