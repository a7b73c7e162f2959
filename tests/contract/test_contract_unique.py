"""Contract: unique tasks (``unique_for``/``unique_key``) on every storage."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_reliable_executor import TaskStatus, TaskSubmitRequest, reliable_task_handler, signals
from django_reliable_executor.core.uniqueness import unique_digest
from django_reliable_executor.exceptions import HandlerRegistrationError, InvalidTaskOptionError
from django_reliable_executor.registry import unregister
from django_reliable_executor.storage.redis.sharding import unique_home
from tests.support.contract_support import claim_and_start, recording, total


def test_a_duplicate_within_the_window_returns_the_same_task(executor, clock):
    with recording(signals.task_submitted) as submitted:
        first = executor.submit("demo.echo", {"a": 1, "b": [2]}, unique_for=60)
        clock.advance(30)
        # The same parameter in another key order is the same key.
        again = executor.submit("demo.echo", {"b": [2], "a": 1}, unique_for=60)
    assert again.task_id == first.task_id
    assert again == executor.get_task(first.task_id)
    assert total(executor.count_by_status()) == 1
    assert [call["task_id"] for call in submitted.calls] == [first.task_id]


def test_a_running_holder_still_holds_the_key(executor):
    first = executor.submit("demo.echo", 1, unique_for=60)
    claim_and_start(executor.storage)
    again = executor.submit("demo.echo", 1, unique_for=60)
    assert (again.task_id, again.status) == (first.task_id, TaskStatus.RUNNING)


def test_a_terminal_holder_lets_a_new_task_take_the_key(executor):
    first = executor.submit("demo.echo", 1, unique_for=60)
    assert executor.cancel_task(first.task_id)
    second = executor.submit("demo.echo", 1, unique_for=60)
    assert second.task_id != first.task_id
    assert second.status is TaskStatus.CREATED
    # The new task holds the key now.
    assert executor.submit("demo.echo", 1, unique_for=60).task_id == second.task_id
    assert total(executor.count_by_status()) == 2


def test_after_the_window_a_new_task_is_stored(executor, clock):
    first = executor.submit("demo.echo", 1, unique_for=10)
    clock.advance(10.5)
    second = executor.submit("demo.echo", 1, unique_for=10)
    assert second.task_id != first.task_id
    assert executor.get_task(first.task_id).status is TaskStatus.CREATED  # the old one stays
    assert executor.submit("demo.echo", 1, unique_for=10).task_id == second.task_id


def test_different_keys_and_parameters_give_different_tasks(executor):
    a = executor.submit("demo.echo", 1, unique_for=60)
    b = executor.submit("demo.echo", 2, unique_for=60)
    c = executor.submit("demo.echo", 1, unique_for=60, unique_key="order:1")
    d = executor.submit("demo.echo", 2, unique_for=60, unique_key="order:1")  # the key decides
    e = executor.submit("demo.echo", 1, unique_for=60, unique_key="order:2")
    f = executor.submit("demo.noop", None, unique_for=60, unique_key="order:1")  # another name
    assert len({a.task_id, b.task_id, c.task_id, e.task_id, f.task_id}) == 5
    assert d.task_id == c.task_id
    assert d.parameter == 1
    assert total(executor.count_by_status()) == 5


def test_without_unique_for_equal_submits_store_two_tasks(executor):
    first = executor.submit("demo.echo", 1)
    second = executor.submit("demo.echo", 1)
    assert first.task_id != second.task_id


def test_one_batch_stores_one_task_per_key(executor):
    infos = executor.submit_many(
        [
            TaskSubmitRequest("demo.echo", 1, unique_for=60),
            TaskSubmitRequest("demo.echo", 2),
            TaskSubmitRequest("demo.echo", 1, unique_for=60),
            TaskSubmitRequest("demo.echo", 2, unique_for=60, unique_key="k"),
            TaskSubmitRequest("demo.echo", 3, unique_for=60, unique_key="k"),
        ]
    )
    ids = [info.task_id for info in infos]
    assert ids[0] == ids[2] and ids[3] == ids[4]
    assert len(set(ids)) == 3
    assert total(executor.count_by_status()) == 3


def test_the_handlers_unique_for_applies_to_every_submit(executor):
    @reliable_task_handler(name="contract.unique_handler", unique_for=60)
    def handler(param):
        return param

    try:
        first = executor.submit(handler.name, {"x": 1})
        assert executor.submit(handler.name, {"x": 1}).task_id == first.task_id
        assert executor.submit(handler.name, {"x": 2}).task_id != first.task_id
        # A submit's own window comes first.
        assert executor.submit(handler.name, {"x": 1}, unique_for=1).task_id == first.task_id
    finally:
        unregister("contract.unique_handler")


def test_a_rolled_back_transaction_leaves_no_key(executor, db_alias):
    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic(using=db_alias):
        inside = executor.submit("demo.echo", 1, unique_for=60)
        executor.submit("demo.echo", 1, unique_for=60)
        raise Boom
    key = unique_digest("demo.echo", None, 1)
    assert executor.storage.unique_holder(key) is None
    assert executor.get_task(inside.task_id) is None
    after = executor.submit("demo.echo", 1, unique_for=60)
    assert after.task_id != inside.task_id
    assert executor.storage.unique_holder(key) == executor.get_task(after.task_id)


def test_a_committed_transaction_keeps_the_key(executor, db_alias):
    with transaction.atomic(using=db_alias):
        inside = executor.submit("demo.echo", 1, unique_for=60, unique_key="tx")
        again = executor.submit("demo.echo", 1, unique_for=60, unique_key="tx")
        # The second submit returns the first's task (Redis writes both at commit).
        assert again.task_id == inside.task_id
    assert executor.get_task(inside.task_id) is not None
    assert executor.submit("demo.echo", 2, unique_for=60, unique_key="tx").task_id == (
        inside.task_id
    )
    assert total(executor.count_by_status()) == 1


def test_unique_submits_of_one_key_in_one_transaction_return_the_first_task(executor, db_alias):
    """Separate submits in one transaction: each later one of the key gets the first's task,
    the one stored once committed (a savepoint rolled back takes its submit's key with it)."""
    with transaction.atomic(using=db_alias):
        first = executor.submit("demo.echo", {"n": 1}, task_id="first", unique_for=60)
        many = executor.submit_many(
            [
                TaskSubmitRequest("demo.echo", {"n": 1}, task_id="second", unique_for=60),
                TaskSubmitRequest("demo.echo", {"n": 2}, task_id="other", unique_for=60),
            ]
        )
        assert [info.task_id for info in many] == ["first", "other"]
        with pytest.raises(RuntimeError), transaction.atomic(using=db_alias):
            executor.submit("demo.echo", {"n": 3}, task_id="undone", unique_for=60)
            raise RuntimeError("rolled back")
        third = executor.submit("demo.echo", {"n": 3}, task_id="third", unique_for=60)
        assert third.task_id == "third"
    assert first.task_id == "first"
    stored = executor.storage.get_many(["first", "second", "other", "undone", "third"])
    assert sorted(stored) == ["first", "other", "third"]
    assert total(executor.count_by_status()) == 3


def test_expired_keys_are_removed_or_expire(executor, clock):
    executor.submit("demo.echo", 1, unique_for=5)
    key = unique_digest("demo.echo", None, 1)
    assert executor.storage.unique_holder(key) is not None
    clock.advance(6)
    assert executor.storage.unique_holder(key) is None
    executor.purge_finished(clock.now())  # the database's expired key rows go with it
    if executor.storage.supports_transactional_enqueue:
        from django_reliable_executor.models import ReliableUniqueKey

        assert not ReliableUniqueKey.objects.using(executor.storage.alias).exists()
    else:
        storage = executor.storage  # the key lives on its home shard (one: the only one)
        home = storage.prefixes[unique_home(key, storage.layout.shards)]
        ttl = storage.client.pttl(home + "u:" + key)
        assert 0 < ttl <= 5000  # Redis drops it by itself


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"unique_for": 0}, "unique_for"),
        ({"unique_for": -1}, "unique_for"),
        ({"unique_for": True}, "unique_for"),
        ({"unique_for": "60"}, "unique_for"),
        ({"unique_for": float("nan")}, "unique_for"),
        ({"unique_for": 10**9}, "unique_for"),
        ({"unique_for": 60, "unique_key": ""}, "unique_key"),
        ({"unique_for": 60, "unique_key": 5}, "unique_key"),
        ({"unique_for": 60, "unique_key": "x" * 192}, "unique_key"),
        ({"unique_key": "k"}, "unique_key"),
    ],
)
def test_bad_unique_options_are_refused_and_store_nothing(executor, options, field):
    with pytest.raises(InvalidTaskOptionError) as caught:
        executor.submit("demo.echo", 1, **options)
    assert caught.value.field == field
    assert field in str(caught.value)
    with pytest.raises(InvalidTaskOptionError):
        executor.submit_many(
            [TaskSubmitRequest("demo.echo", 2), TaskSubmitRequest("demo.echo", 1, **options)]
        )
    assert total(executor.count_by_status()) == 0


@pytest.mark.parametrize("value", [0, -5, True, "10", float("inf")])
def test_a_bad_unique_for_fails_at_decoration(value):
    with pytest.raises(HandlerRegistrationError, match="unique_for"):
        reliable_task_handler(name="contract.bad_unique", unique_for=value)(lambda p: p)


@pytest.mark.parametrize("call", ["submit", "submit_many", "with_dependency"])
def test_a_unique_submit_naming_an_existing_task_id_answers_with_that_task_and_takes_no_key(
    executor, call
):
    """Found by the model-based test on the databases: the existing task answers, unchanged,
    even when another task holds the key, and the key stays with its holder (or free)."""
    plain = executor.submit("demo.echo", 0, task_id="plain")
    holder = executor.submit("demo.echo", 1, unique_for=60, unique_key="k-held")
    dependency = executor.submit("demo.echo", 2, task_id="dependency")

    def again(key: str):
        request = TaskSubmitRequest(
            "demo.echo",
            9,
            task_id="plain",
            unique_for=60,
            unique_key=key,
            depends_on=["dependency"] if call == "with_dependency" else None,
        )
        if call == "submit":
            return executor.submit("demo.echo", 9, task_id="plain", unique_for=60, unique_key=key)
        return executor.submit_many([request])[0]

    for key in ("k-held", "k-free"):
        answer = again(key)
        assert (answer.task_id, answer.parameter) == ("plain", 0), key
    assert executor.get_task("plain") == plain
    # The held key still names its holder; the free one was not taken by "plain".
    assert executor.submit("demo.echo", 3, unique_for=60, unique_key="k-held") == holder
    fresh = executor.submit("demo.echo", 4, unique_for=60, unique_key="k-free")
    assert fresh.task_id not in {"plain", holder.task_id, dependency.task_id}
    assert total(executor.count_by_status()) == 4


def test_a_task_of_a_call_cancelled_at_once_frees_its_key_for_a_later_request_of_the_call(
    executor,
):
    """Each request of a multi-task call is settled as if submitted alone after the ones before
    it: a task cancelled as it is stored (its dependency already failed) has ended, and a later
    request of the same key is stored, not answered with the cancelled task (found by the
    model-based test on Redis, whose script decided every key's holder before any cancel)."""
    executor.submit("demo.echo", 0, task_id="gone")
    assert executor.cancel_task("gone")

    def unique(task_id: str, **options) -> TaskSubmitRequest:
        return TaskSubmitRequest(
            "demo.echo", task_id, task_id=task_id, unique_for=60, unique_key="k", **options
        )

    answers = executor.submit_many([unique("doomed", depends_on=["gone"]), unique("kept")])
    assert [(a.task_id, a.status) for a in answers] == [
        ("doomed", TaskStatus.CANCELLED),
        ("kept", TaskStatus.CREATED),
    ]
    # The key's holder is the task that was stored after the cancelled one.
    assert executor.submit("demo.echo", 1, unique_for=60, unique_key="k").task_id == "kept"
