"""Contract: debounce (``debounce``/``debounce_max_wait``) on every storage: submits of one key
keep one waiting task, with the latest parameter, run ``debounce`` after the last submit or
``debounce_max_wait`` after the first; once it is claimed, the next submit opens a new window."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db import transaction

from django_reliable_executor import TaskStatus, TaskSubmitRequest, reliable_task_handler, signals
from django_reliable_executor.exceptions import HandlerRegistrationError, InvalidTaskOptionError
from django_reliable_executor.registry import unregister
from tests.support.contract_support import LEASE, claim_and_start, recording, total


def submit(executor, parameter, **options):
    options = {"debounce": 10, "unique_key": "k", **options}
    return executor.submit("demo.echo", parameter, **options)


def test_submits_within_the_window_keep_one_task_with_the_latest_parameter(executor, clock):
    with recording(signals.task_submitted) as submitted:
        first = submit(executor, {"n": 1})
        assert not first.debounced
        assert first.run_at == first.created_at + dt.timedelta(seconds=10)
        clock.advance(3)
        again = submit(executor, {"n": 2})
    assert (again.task_id, again.debounced, again.parameter) == (first.task_id, True, {"n": 2})
    assert again.run_at == clock.now() + dt.timedelta(seconds=10)
    stored = executor.get_task(first.task_id)
    assert (stored.parameter, stored.run_at, stored.debounced) == ({"n": 2}, again.run_at, False)
    assert total(executor.count_by_status()) == 1
    assert [call["task_id"] for call in submitted.calls] == [first.task_id]
    # Not due until debounce after the last submit.
    clock.advance(9.9)
    assert executor.storage.claim("w1", ["default"], 10, LEASE) == []
    clock.advance(0.2)
    [claim] = executor.storage.claim("w1", ["default"], 10, LEASE)
    assert (claim.task_id, claim.task.parameter) == (first.task_id, {"n": 2})


def test_debounce_max_wait_caps_the_wait_from_the_first_submit(executor, clock):
    first = submit(executor, 0, debounce_max_wait=30)
    for n in range(1, 6):  # a submit every 5 s: the task keeps moving, but not past 30 s
        clock.advance(5)
        joined = submit(executor, n, debounce_max_wait=30)
        assert joined.task_id == first.task_id and joined.debounced
    assert joined.run_at == first.created_at + dt.timedelta(seconds=30)
    clock.advance(5)
    assert submit(executor, 6, debounce_max_wait=30).task_id == first.task_id  # due, unclaimed
    [claim] = executor.storage.claim("w1", ["default"], 10, LEASE)
    assert (claim.task_id, claim.task.parameter) == (first.task_id, 6)


def test_once_the_task_is_claimed_the_next_submit_opens_a_new_window(executor, clock):
    first = submit(executor, 1)
    clock.advance(10)
    claim_and_start(executor.storage)
    second = submit(executor, 2)
    assert second.task_id != first.task_id and not second.debounced
    assert submit(executor, 3).task_id == second.task_id
    assert executor.get_task(first.task_id).parameter == 1  # the running one keeps its own
    assert executor.get_task(second.task_id).parameter == 3


def test_a_claimed_task_handed_back_unstarted_is_joined_again(executor, clock):
    first = submit(executor, 1)
    clock.advance(10)
    claims = executor.storage.claim("w1", ["default"], 10, LEASE)
    assert executor.storage.release(claims) == 1
    assert submit(executor, 2).task_id == first.task_id


def test_a_cancelled_task_lets_the_next_submit_open_a_new_window(executor):
    first = submit(executor, 1)
    assert executor.cancel_task(first.task_id)
    second = submit(executor, 2)
    assert second.task_id != first.task_id and second.status is TaskStatus.CREATED


def test_debounced_submits_inside_a_transaction_join_once_committed(executor, db_alias, clock):
    """Inside atomic() (Redis writes at commit): the answers are what the commit stores."""
    before = submit(executor, 0)
    with transaction.atomic(using=db_alias):
        clock.advance(1)
        one = submit(executor, 1)
        two = submit(executor, 2)
        assert (one.task_id, two.task_id) == (before.task_id, before.task_id)
        assert (one.debounced, two.debounced, two.parameter) == (True, True, 2)
    stored = executor.get_task(before.task_id)
    assert (stored.parameter, stored.run_at) == (2, two.run_at)
    assert total(executor.count_by_status()) == 1


def test_a_rolled_back_transaction_leaves_the_key_as_it_was(executor, db_alias, clock):
    before = submit(executor, 0)
    with pytest.raises(RuntimeError), transaction.atomic(using=db_alias):
        clock.advance(1)
        assert submit(executor, 1).debounced
        raise RuntimeError
    stored = executor.get_task(before.task_id)
    assert (stored.parameter, stored.run_at) == (0, before.run_at)


def test_the_key_is_the_parameter_without_a_unique_key(executor):
    a = executor.submit("demo.echo", {"x": 1}, debounce=5)
    b = executor.submit("demo.echo", {"x": 1}, debounce=5)
    c = executor.submit("demo.echo", {"x": 2}, debounce=5)
    assert b.task_id == a.task_id and b.debounced
    assert c.task_id != a.task_id
    # A unique task of the same parameter is another key altogether.
    d = executor.submit("demo.echo", {"x": 1}, unique_for=60)
    assert d.task_id not in (a.task_id, c.task_id)


def test_submit_many_joins_within_the_call(executor):
    requests = [TaskSubmitRequest("demo.echo", n, debounce=10, unique_key="many") for n in range(3)]
    infos = executor.submit_many(requests)
    assert len({info.task_id for info in infos}) == 1
    assert [info.debounced for info in infos] == [False, True, True]
    assert executor.get_task(infos[0].task_id).parameter == 2


def test_the_handlers_debounce_applies_to_every_submit():
    @reliable_task_handler(name="tests.debounced", debounce=5, debounce_max_wait=20)
    def debounced(param=None) -> None: ...

    try:
        assert (debounced.debounce, debounced.debounce_max_wait) == (5, 20)
    finally:
        unregister("tests.debounced")


def test_a_debounced_tasks_max_duration_counts_from_when_it_is_due(executor, clock):
    first = submit(executor, 1, max_duration_millis=15_000)
    clock.advance(8)
    submit(executor, 2, max_duration_millis=15_000)  # due 18 s after the first submit
    clock.advance(16)  # past 15 s from the first submit, not from when it is due
    assert executor.storage.expire_overdue(100) == []
    [claim] = executor.storage.claim("w1", ["default"], 10, LEASE)
    assert (claim.task_id, claim.task.parameter) == (first.task_id, 2)


def test_a_submits_own_debounce_keeps_the_handlers_longest_wait(executor, clock):
    @reliable_task_handler(name="tests.debounced_wait", debounce=5, debounce_max_wait=12)
    def debounced(param=None) -> None: ...

    try:
        first = executor.submit("tests.debounced_wait", 1, debounce=10)
        clock.advance(4)
        again = executor.submit("tests.debounced_wait", 1, debounce=10)
        assert again.task_id == first.task_id
        assert again.run_at == first.created_at + dt.timedelta(seconds=12)
    finally:
        unregister("tests.debounced_wait")


def test_a_handlers_debounce_joins_submits(executor, clock):
    @reliable_task_handler(name="tests.debounced_submits", debounce=dt.timedelta(seconds=4))
    def debounced(param=None) -> None: ...

    try:
        a = executor.submit("tests.debounced_submits", 1)
        clock.advance(1)
        b = executor.submit("tests.debounced_submits", 1)
        assert b.task_id == a.task_id and b.debounced
        assert b.run_at == clock.now() + dt.timedelta(seconds=4)
    finally:
        unregister("tests.debounced_submits")


@pytest.mark.parametrize(
    ("options", "field", "words"),
    [
        ({"debounce": 0}, "debounce", "debounce must be a number of seconds above 0"),
        ({"debounce": -1}, "debounce", "debounce must be"),
        ({"debounce": "5"}, "debounce", "debounce must be"),
        ({"debounce": float("nan")}, "debounce", "debounce must be"),
        ({"debounce_max_wait": 30}, "debounce_max_wait", "debounce_max_wait needs debounce"),
        ({"debounce": 10, "debounce_max_wait": 5}, "debounce_max_wait", "at least debounce"),
        ({"debounce": 10, "unique_for": 60}, "unique_for", "debounce does not go with"),
        ({"debounce": 10, "delay_millis": 5}, "delay_millis", "debounce sets when"),
        ({"debounce": 10, "depends_on": ["x"]}, "depends_on", "debounce does not go with"),
        ({"debounce": 10, "unique_key": ""}, "unique_key", "unique_key must be"),
    ],
)
def test_a_bad_debounce_is_refused_and_stores_nothing(seeded, options, field, words):
    with pytest.raises(InvalidTaskOptionError) as excinfo:
        seeded.submit("demo.echo", 1, **options)
    assert excinfo.value.field == field
    assert words in str(excinfo.value)
    assert total(seeded.count_by_status()) == 1


def test_a_batch_member_or_callback_is_not_debounced(seeded):
    member = TaskSubmitRequest("demo.echo", 1, debounce=5)
    with pytest.raises(InvalidTaskOptionError, match="a batch member is not debounced"):
        seeded.submit_batch([member])
    callback = TaskSubmitRequest("demo.echo", 1, debounce=5)
    with pytest.raises(InvalidTaskOptionError, match="debounce does not apply to a batch"):
        seeded.submit_batch([TaskSubmitRequest("demo.echo", 2)], on_complete=callback)
    assert total(seeded.count_by_status()) == 1


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"debounce_max_wait": 5}, "debounce_max_wait needs debounce"),
        ({"debounce": 5, "unique_for": 5}, "debounce and unique_for do not go together"),
        ({"debounce": 5, "debounce_max_wait": 1}, "at least debounce"),
        ({"debounce": 0}, "debounce must be"),
    ],
)
def test_a_bad_handler_debounce_is_refused(options, words):
    with pytest.raises(HandlerRegistrationError, match=words):

        @reliable_task_handler(name="tests.bad_debounce", **options)
        def bad() -> None: ...
