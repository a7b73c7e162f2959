"""Debounce on Redis: a submit joining a task that waits due already (in a ready list, or in a
parked set while its name is at its cap) leaves it in place with its later run at, marked
(``jd``), and the claim that pops it before that run at puts it back in the schedule instead of
taking it: it holds up no other task, takes no slot and logs no rate-limited claim."""

from __future__ import annotations

import datetime as dt

from django_reliable_executor.core.rate_limits import RateLimit
from django_reliable_executor.storage.redis.codec import micros
from tests.support.redis_support import LEASE, assert_consistent

QUEUE = "default"


def submit(executor, parameter, **options):
    return executor.submit("demo.echo", parameter, debounce=10, unique_key="k", **options)


def ready_ids(storage, priority: int) -> list[str]:
    return storage.client.lrange(f"{storage._queue_prefix(QUEUE)}ready:{QUEUE}:{priority}", 0, -1)


def scheduled_at(storage, task_id: str) -> float | None:
    return storage.client.zscore(storage._queue_prefix(QUEUE) + "sched:" + QUEUE, task_id)


def marked(storage, task_id: str) -> bool:
    return storage.client.hexists(storage._queue_prefix(QUEUE) + "t:" + task_id, "jd")


def claimed_ids(storage, **limits) -> list[str]:
    return [c.task_id for c in storage.claim("w1", [QUEUE], 10, LEASE, **limits)]


def due_in_its_ready_list(executor, storage, clock):
    """A debounced task due and promoted to its ready list (workers busy), then joined 2 s
    later: due 10 s after the join."""
    first = submit(executor, 1)
    clock.advance(10)
    assert storage.promote_due(100) == 1
    assert ready_ids(storage, first.priority) == [first.task_id]
    clock.advance(2)
    joined = submit(executor, 2)
    assert (joined.task_id, joined.debounced) == (first.task_id, True)
    assert joined.run_at == clock.now() + dt.timedelta(seconds=10)
    return joined


def test_a_due_task_joined_in_its_ready_list_is_scheduled_by_the_claim_that_pops_it(
    executor, storage, clock
):
    joined = due_in_its_ready_list(executor, storage, clock)
    # Left where it waits (finding it in the list would walk it), marked.
    assert ready_ids(storage, joined.priority) == [joined.task_id]
    assert marked(storage, joined.task_id)
    assert storage.oldest_due(QUEUE) is None  # not due, though in a ready list
    assert_consistent(storage)
    other = executor.submit("demo.echo", "other")  # due now, behind it in the list
    assert claimed_ids(storage) == [other.task_id]
    assert scheduled_at(storage, joined.task_id) == int(micros(joined.run_at))
    assert not marked(storage, joined.task_id)
    assert_consistent(storage)
    clock.advance(9.9)
    assert claimed_ids(storage) == []
    clock.advance(0.1)
    [claim] = storage.claim("w1", [QUEUE], 10, LEASE)
    assert (claim.task_id, claim.task.parameter) == (joined.task_id, 2)
    assert_consistent(storage)


def test_a_joined_task_due_again_by_its_longest_wait_is_taken_where_it_is(executor, storage, clock):
    first = submit(executor, 1, debounce_max_wait=12)
    clock.advance(10)
    storage.promote_due(100)
    joined = submit(executor, 2, debounce_max_wait=12)
    assert joined.run_at == first.created_at + dt.timedelta(seconds=12)
    clock.advance(2)
    again = submit(executor, 3, debounce_max_wait=12)  # due now: its longest wait is over
    assert again.run_at == clock.now() and again.task_id == first.task_id
    [claim] = storage.claim("w1", [QUEUE], 10, LEASE)
    assert (claim.task_id, claim.task.parameter) == (first.task_id, 3)
    assert not marked(storage, first.task_id)
    assert_consistent(storage)


def test_a_joined_task_scheduled_again_logs_no_rate_limited_claim(executor, storage, clock):
    joined = due_in_its_ready_list(executor, storage, clock)
    other = executor.submit("demo.echo", "other")
    # One claim a second: the joined task, popped first, does not use it up.
    limits = {"rate_limits": {"demo.echo": RateLimit(1, 1.0)}, "start": 10}
    assert claimed_ids(storage, **limits) == [other.task_id]
    assert scheduled_at(storage, joined.task_id) == int(micros(joined.run_at))
    assert_consistent(storage)


def test_a_due_task_joined_in_its_names_parked_set_is_rescored_and_scheduled_when_taken(
    executor, storage, clock
):
    caps = {"name_limits": {"demo.echo": 1}}
    executor.submit("demo.echo", "busy")
    [busy_claim] = storage.claim("w1", [QUEUE], 10, LEASE, **caps)
    first = submit(executor, 1)
    clock.advance(10)
    assert claimed_ids(storage, **caps) == []  # at its cap: parked
    parked = f"{storage._queue_prefix(QUEUE)}parked:demo.echo:{first.priority}"
    assert storage.client.zscore(parked, first.task_id) is not None
    clock.advance(2)
    joined = submit(executor, 2)
    assert joined.debounced
    # Rescored with its new run at (claims take parked tasks in run-at order), marked.
    assert storage.client.zscore(parked, first.task_id) == int(micros(joined.run_at))
    assert marked(storage, first.task_id)
    assert_consistent(storage)
    assert executor.cancel_task(busy_claim.task_id)  # a slot frees: the parked task competes
    assert claimed_ids(storage, **caps) == []
    assert storage.client.zscore(parked, first.task_id) is None
    assert scheduled_at(storage, first.task_id) == int(micros(joined.run_at))
    assert_consistent(storage)
    clock.advance(10)
    [claim] = storage.claim("w1", [QUEUE], 10, LEASE, **caps)
    assert (claim.task_id, claim.task.parameter) == (first.task_id, 2)
    assert_consistent(storage)


def test_a_cancelled_joined_task_keeps_no_mark(executor, storage, clock):
    joined = due_in_its_ready_list(executor, storage, clock)
    assert executor.cancel_task(joined.task_id)
    assert not marked(storage, joined.task_id)
    assert_consistent(storage)
    # Its key answers no more: the next submit opens a new window.
    assert submit(executor, 3).task_id != joined.task_id


def test_a_joined_task_let_out_for_a_freed_slot_of_its_key_passes_the_slot_on(
    executor, storage, clock
):
    """Parked by its concurrency key (full), joined, then let out first when the slot frees
    (a higher priority): the claim that schedules it lets the key's next parked task out."""
    keyed = {"key_limits": {"demo.echo": 1}}
    executor.submit("demo.echo", "busy", concurrency_key="c")
    [busy_claim] = storage.claim("w1", [QUEUE], 10, LEASE, **keyed)
    first = submit(executor, 1, concurrency_key="c", priority=5)
    clock.advance(10)
    later = executor.submit("demo.echo", "later", concurrency_key="c")
    assert claimed_ids(storage, **keyed) == []  # both parked by their key
    clock.advance(2)
    joined = submit(executor, 2, concurrency_key="c", priority=5)
    assert joined.debounced and marked(storage, first.task_id)
    assert_consistent(storage)  # rescored in its key's parked set
    assert executor.cancel_task(busy_claim.task_id)  # the key's slot goes to `first`
    assert claimed_ids(storage, **keyed) == [later.task_id]
    assert scheduled_at(storage, first.task_id) == int(micros(joined.run_at))
    assert_consistent(storage)


def test_a_join_moves_the_deadline_index_with_the_run_at(executor, storage, clock):
    first = submit(executor, 1, max_duration_millis=15_000)
    clock.advance(8)
    joined = submit(executor, 2, max_duration_millis=15_000)
    deadline = joined.run_at + dt.timedelta(seconds=15)
    score = storage.client.zscore(storage._queue_prefix(QUEUE) + "deadlines", first.task_id)
    assert score == int(micros(deadline))
    assert_consistent(storage)
