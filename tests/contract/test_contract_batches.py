"""Contract: batches on every storage — counts, callbacks submitted exactly once (on_success only
when every member completed), a retried member never refiring them, bad input storing nothing."""

from __future__ import annotations

import datetime as dt

import pytest

from django_reliable_executor import (
    InvalidDependencyError,
    TaskStatus,
    TaskSubmitError,
    TaskSubmitRequest,
)
from django_reliable_executor.master.chores import MasterChores
from tests.support.contract_support import HOOKS, LEASE, raising, run_claims


def members(n: int, name: str = "contract.hook", prefix: str = "m") -> list[TaskSubmitRequest]:
    return [TaskSubmitRequest(name, {"i": i}, task_id=f"{prefix}{i}") for i in range(n)]


@pytest.fixture(autouse=True)
def _redis_indexes_stay_exact(alias, storage):
    """On Redis, after each test: the batch hashes' counters equal their members' statuses,
    and every index invariant of the storage holds."""
    yield
    if alias == "redis":
        from tests.support.redis_support import index_problems

        assert index_problems(storage) == []


def callbacks(executor) -> dict[str, TaskStatus]:
    """The callback tasks stored so far, by id."""
    found = executor.storage.get_many(["done", "ok"])
    return {task_id: info.status for task_id, info in found.items()}


def run_all(executor, limit: int = 50):
    claims = executor.storage.claim("w1", ["default"], limit, LEASE)
    return run_claims(executor, claims)


def on_done() -> TaskSubmitRequest:
    return TaskSubmitRequest("contract.hook", {"report": True}, task_id="done")


def on_ok() -> TaskSubmitRequest:
    return TaskSubmitRequest("contract.hook", None, task_id="ok")


def test_counts_and_callbacks_of_a_batch_that_succeeds(executor):
    info = executor.submit_batch(
        members(3), batch_id="b1", on_complete=on_done(), on_success=on_ok()
    )
    assert (info.batch_id, info.total, info.pending, info.finished) == ("b1", 3, 3, False)
    assert (info.completed, info.failed, info.cancelled) == (0, 0, 0)
    assert info.created_at == executor.clock.now()
    assert executor.get_task("m0").batch_id == "b1"
    assert callbacks(executor) == {}

    seen: dict[str, str | None] = {}
    HOOKS["m0"] = lambda context: seen.setdefault("member", context.batch_id)
    claims = executor.storage.claim("w1", ["default"], 2, LEASE)
    run_claims(executor, claims)
    partial = executor.get_batch("b1")
    assert (partial.completed, partial.pending, partial.finished) == (2, 1, False)
    assert callbacks(executor) == {}

    run_all(executor)  # the last member
    done = executor.get_batch("b1")
    assert (done.total, done.completed, done.pending, done.finished) == (3, 3, 0, True)
    assert callbacks(executor) == {"done": TaskStatus.CREATED, "ok": TaskStatus.CREATED}
    assert executor.get_task("done").batch_id == "b1"
    assert executor.get_task("done").parameter == {"report": True}

    HOOKS["done"] = lambda context: seen.setdefault("callback", context.batch_id)
    run_all(executor)  # the two callbacks: they count in no batch
    assert seen == {"member": "b1", "callback": "b1"}
    after = executor.get_batch("b1")
    assert (after.total, after.completed, after.pending) == (3, 3, 0)


def test_a_member_that_fails_fires_on_complete_not_on_success(executor):
    executor.submit_batch(members(3), batch_id="b2", on_complete=on_done(), on_success=on_ok())
    HOOKS["m1"] = raising(ValueError("bad row"))
    executor.cancel_task("m2")
    for _ in range(4):  # m1 retries (retry_limit 3) until it fails for good
        run_all(executor)
        executor.clock.advance(2)
    info = executor.get_batch("b2")
    assert (info.completed, info.failed, info.cancelled, info.pending) == (1, 1, 1, 0)
    assert info.finished is True
    assert callbacks(executor) == {"done": TaskStatus.CREATED}


def test_a_retried_member_of_a_finished_batch_is_counted_again_but_never_refires(executor):
    executor.submit_batch(members(2), batch_id="b3", on_complete=on_done(), on_success=on_ok())
    executor.cancel_task("m1")
    run_all(executor)
    info = executor.get_batch("b3")
    assert (info.completed, info.cancelled, info.finished) == (1, 1, True)
    assert callbacks(executor) == {"done": TaskStatus.CREATED}
    run_all(executor)  # the on_complete callback runs

    assert executor.retry_task("m1") is True
    reopened = executor.get_batch("b3")
    assert (reopened.cancelled, reopened.pending, reopened.finished) == (0, 1, True)
    run_all(executor)
    again = executor.get_batch("b3")
    assert (again.completed, again.cancelled, again.pending) == (2, 0, 0)
    # Every member completed now, but the batch had finished: on_success is never submitted,
    # and on_complete is not submitted again (it ran once, COMPLETED).
    assert callbacks(executor) == {"done": TaskStatus.COMPLETED}


def test_timeouts_and_lost_workers_count_as_failed(executor, storage, clock):
    requests = [
        TaskSubmitRequest("contract.hook", None, task_id="t0", max_duration_millis=1000),
        TaskSubmitRequest("contract.hook", None, task_id="t1", retry_limit=0),
    ]
    executor.submit_batch(requests, batch_id="b4", on_complete=on_done())
    started = storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    assert sorted(c.task_id for c in started if c is not None) == ["t0", "t1"]
    clock.advance(2)
    assert [t.task.task_id for t in storage.expire_overdue(10)] == ["t0"]
    clock.advance(LEASE + 1)
    assert [t.status for t in storage.recover_expired(10)] == [TaskStatus.FAILED]
    info = executor.get_batch("b4")
    assert (info.failed, info.pending, info.finished) == (2, 0, True)
    assert callbacks(executor) == {"done": TaskStatus.CREATED}


def test_a_batch_whose_members_all_ended_before_the_seal_fires_on_seal(executor, storage):
    """Members stored, ended, then the seal: the seal itself finds them all ended."""
    from django_reliable_executor.core.batches import NewBatch
    from django_reliable_executor.service.submitting import prepare

    now = executor.clock.now()
    callback = prepare(on_done(), now, executor.settings, 0)
    batch = NewBatch("b5", now, callback, None)
    assert storage.open_batch(batch) is True
    assert storage.open_batch(NewBatch("b5", now, None, None)) is False
    task = batch.member(prepare(members(1)[0], now, executor.settings, 0))
    storage.add_to_batch("b5", [task])
    open_info = executor.get_batch("b5")
    assert (open_info.total, open_info.sealed, open_info.finished) == (1, False, False)
    run_all(executor)
    assert executor.get_batch("b5").finished is False  # not sealed: no fan-in yet
    assert callbacks(executor) == {}
    sealed = storage.seal_batch("b5")
    assert (sealed.sealed, sealed.finished, sealed.completed) == (True, True, 1)
    assert callbacks(executor) == {"done": TaskStatus.CREATED}
    storage.seal_batch("b5")  # sealing again changes nothing
    assert callbacks(executor) == {"done": TaskStatus.CREATED}


def test_list_tasks_by_batch_id_lists_its_members_and_callbacks(executor):
    executor.submit("contract.hook", None, task_id="outsider")
    requests = [
        TaskSubmitRequest("contract.hook", None, task_id=f"m{i}", retry_limit=0) for i in range(3)
    ]
    executor.submit_batch(requests, batch_id="b5", on_complete=on_done())
    executor.submit_batch(members(1, prefix="x"), batch_id="b6")
    HOOKS["m1"] = raising(ValueError("no"))
    executor.cancel_task("m2")

    def listed(**filters) -> list[str]:
        return sorted(t.task_id for t in executor.list_tasks(batch_id="b5", **filters))

    assert listed() == ["m0", "m1", "m2"]
    run_all(executor)  # m0 completes, m1 fails: the batch finishes and stores "done"
    assert listed() == ["done", "m0", "m1", "m2"]  # the callback carries the batch's id
    assert listed(status=TaskStatus.COMPLETED) == ["m0"]
    assert listed(statuses=[TaskStatus.FAILED, TaskStatus.ERROR]) == ["m1"]
    assert listed(status=TaskStatus.CANCELLED) == ["m2"]
    assert [t.task_id for t in executor.list_tasks(batch_id="b6")] == ["x0"]
    assert executor.list_tasks(batch_id="nope") == []
    for bad in ("", 5):
        with pytest.raises(ValueError, match="batch_id"):
            executor.list_tasks(batch_id=bad)


def test_get_batch_of_an_unknown_id_is_none(executor):
    assert executor.get_batch("nope") is None
    assert executor.get_batch("") is None


def _nothing_stored(executor, batch_id: str = "bad") -> None:
    assert executor.get_batch(batch_id) is None
    assert executor.list_tasks() == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"requests": []}, "requests"),
        ({"requests": "m0"}, "requests"),
        ({"on_complete": "contract.hook"}, "on_complete"),
        ({"on_success": TaskSubmitRequest("no.such.task")}, "on_success.task_name"),
        ({"on_complete": TaskSubmitRequest("contract.hook", unique_for=10)}, "on_complete"),
        ({"batch_id": "has space"}, "batch_id"),
        ({"batch_id": 7}, "batch_id"),
    ],
)
def test_bad_batch_input_names_the_field_and_stores_nothing(executor, kwargs, field):
    arguments = {"requests": members(3), "batch_id": "bad", **kwargs}
    with pytest.raises(TaskSubmitError) as raised:
        executor.submit_batch(**arguments)
    assert raised.value.field == field
    _nothing_stored(executor)


@pytest.mark.parametrize("field", ["on_complete", "on_success"])
def test_a_callback_is_checked_like_a_member_and_refused_when_it_could_never_run(executor, field):
    """A callback with an existing task's id would never be stored (that task stands in for
    it); one with depends_on would have its dependencies dropped, or wait for a task that
    never comes: each is refused naming the field, and nothing is stored."""
    executor.submit("contract.hook", None, task_id="there")
    refused = [
        (TaskSubmitRequest("contract.hook", task_id="there"), TaskSubmitError, "task_id"),
        (
            TaskSubmitRequest("contract.hook", task_id="cb", depends_on=["there"]),
            InvalidDependencyError,
            "depends_on",
        ),
        (
            TaskSubmitRequest("contract.hook", task_id="cb", depends_on=["nowhere"]),
            InvalidDependencyError,
            "depends_on",
        ),
        (
            TaskSubmitRequest("contract.hook", task_id="cb", on_dependency_failure="run"),
            InvalidDependencyError,
            "on_dependency_failure",
        ),
    ]
    for callback, error, what in refused:
        with pytest.raises(error) as raised:
            executor.submit_batch(members(2), batch_id="bad", **{field: callback})
        assert raised.value.field == f"{field}.{what}", callback
        assert field in str(raised.value)
        assert executor.get_batch("bad") is None
        assert [t.task_id for t in executor.list_tasks()] == ["there"]


def test_a_bad_member_late_in_a_large_batch_stores_nothing(executor):
    requests = members(2500)
    requests[2400] = TaskSubmitRequest("contract.hook", {1, 2}, task_id="x")  # not JSON
    with pytest.raises(TaskSubmitError) as raised:
        executor.submit_batch(requests, batch_id="bad")
    assert raised.value.field == "task_parameter"
    _nothing_stored(executor)


def test_members_must_be_new_distinct_tasks_and_the_id_unused(executor):
    executor.submit("contract.hook", None, task_id="m1")
    with pytest.raises(TaskSubmitError, match="m1") as raised:
        executor.submit_batch(members(3), batch_id="bad")
    assert raised.value.field == "task_id"
    repeated = [*members(2, prefix="r"), TaskSubmitRequest("contract.hook", task_id="r0")]
    with pytest.raises(TaskSubmitError, match="repeated"):
        executor.submit_batch(repeated, batch_id="bad")
    # ... also when the two are in different chunks of the batch (1 000 members a chunk)
    far_apart = [*members(1500, prefix="f"), TaskSubmitRequest("contract.hook", task_id="f3")]
    with pytest.raises(TaskSubmitError, match="'f3' is repeated") as apart:
        executor.submit_batch(far_apart, batch_id="bad")
    assert apart.value.field == "task_id"
    with pytest.raises(TaskSubmitError, match="callback") as clash:
        executor.submit_batch(
            members(2, prefix="c"),
            batch_id="bad",
            on_complete=TaskSubmitRequest("contract.hook", task_id="c1"),
        )
    assert clash.value.field == "task_id"
    assert executor.get_batch("bad") is None
    assert [t.task_id for t in executor.list_tasks()] == ["m1"]

    executor.submit_batch(members(1, prefix="u"), batch_id="used")
    with pytest.raises(TaskSubmitError, match="already used") as used:
        executor.submit_batch(members(1, prefix="v"), batch_id="used")
    assert used.value.field == "batch_id"
    assert executor.get_task("v0") is None


def test_a_default_batch_id_is_made_up(executor):
    info = executor.submit_batch(members(2))
    assert len(info.batch_id) == 32
    assert executor.get_task("m1").batch_id == info.batch_id


def test_a_batch_submitted_in_a_rolled_back_transaction_leaves_nothing(executor, alias):
    from django.db import transaction

    database = "default" if alias == "redis" else alias
    with pytest.raises(RuntimeError), transaction.atomic(using=database):
        info = executor.submit_batch(members(3), batch_id="rb", on_complete=on_done())
        assert (info.total, info.finished) == (3, False)
        raise RuntimeError("roll back")
    _nothing_stored(executor, "rb")


def test_members_cancelled_by_a_failed_dependency_count_as_cancelled(executor):
    """A member whose dependency failed is cancelled by that failure's write, and so are its
    own dependents (cascaded): each counts in the batch, which then finishes."""
    executor.submit("contract.hook", None, task_id="root", retry_limit=0)
    executor.submit("contract.hook", None, task_id="gone", retry_limit=0)
    executor.cancel_task("gone")  # ended badly before the batch: its dependent is cancelled at once
    requests = [
        TaskSubmitRequest("contract.hook", None, task_id="m0", depends_on=["root"]),
        TaskSubmitRequest("contract.hook", None, task_id="m1", depends_on=["m0"]),
        TaskSubmitRequest("contract.hook", None, task_id="m2"),
        TaskSubmitRequest("contract.hook", None, task_id="m3", depends_on=["gone"]),
    ]
    executor.submit_batch(requests, batch_id="b9", on_complete=on_done(), on_success=on_ok())
    assert executor.get_task("m3").status is TaskStatus.CANCELLED
    HOOKS["root"] = raising(ValueError("no root"))
    run_all(executor)  # root fails for good, m2 completes
    statuses = {t: executor.get_task(t).status for t in ("root", "m0", "m1", "m2")}
    assert statuses == {
        "root": TaskStatus.FAILED,
        "m0": TaskStatus.CANCELLED,
        "m1": TaskStatus.CANCELLED,  # cascaded from m0
        "m2": TaskStatus.COMPLETED,
    }
    info = executor.get_batch("b9")
    assert (info.completed, info.failed, info.cancelled, info.pending) == (1, 0, 3, 0)
    assert info.finished is True
    assert callbacks(executor) == {"done": TaskStatus.CREATED}


def test_a_member_depending_on_an_unknown_task_stores_nothing(executor):
    requests = [
        TaskSubmitRequest("contract.hook", None, task_id="m0"),
        TaskSubmitRequest("contract.hook", None, task_id="m1", depends_on=["m0", "nowhere"]),
    ]
    with pytest.raises(InvalidDependencyError) as caught:
        executor.submit_batch(requests, batch_id="b10", on_complete=on_done())
    assert caught.value.field == "depends_on"
    assert executor.get_batch("b10") is None
    assert executor.storage.get_many(["m0", "m1", "done"]) == {}


def test_members_carry_the_submitters_trace_context_and_their_batch(executor):
    """Submitted inside a span: each member stores that span's trace context beside its batch
    id (on Redis two distinct values of store_task), the callback its batch id."""
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("contract")
    with tracer.start_as_current_span("submitter") as span:
        executor.submit_batch(members(2), batch_id="b11", on_complete=on_done())
    trace_id = format(span.get_span_context().trace_id, "032x")
    for task_id in ("m0", "m1"):
        info = executor.get_task(task_id)
        assert info.batch_id == "b11"
        assert info.trace_context["traceparent"].split("-")[1] == trace_id
    run_all(executor)
    assert executor.get_task("done").batch_id == "b11"
    assert executor.get_batch("b11").completed == 2


# -- purge ------------------------------------------------------------------------------------
def _finished_batch(executor, batch_id: str) -> None:
    """A batch of one member, cancelled: finished now, its callback run now too."""
    executor.submit_batch(
        members(1, prefix=f"{batch_id}-"),
        batch_id=batch_id,
        on_complete=TaskSubmitRequest("contract.hook", None, task_id=f"{batch_id}-done"),
    )
    executor.cancel_task(f"{batch_id}-0")
    run_all(executor)
    assert executor.get_batch(batch_id).finished


def _open_batch(executor, n: int) -> None:
    """A batch of ``n`` members in a queue no test claims: it never finishes here."""
    requests = [
        TaskSubmitRequest("contract.hook", task_id=f"open-{i}", queue="q2") for i in range(n)
    ]
    executor.submit_batch(requests, batch_id="open")


def test_batches_finished_before_the_cutoff_are_purged_others_kept(executor, storage, clock):
    _finished_batch(executor, "old")
    _open_batch(executor, 2)
    executor.cancel_task("open-0")
    clock.advance(10)
    cutoff = clock.now()
    _finished_batch(executor, "old2")  # finished at the cutoff: not before it
    clock.advance(10)
    assert storage.purge_batches(cutoff, 100) == 1
    assert executor.get_batch("old") is None
    assert executor.get_batch("old2").finished
    assert executor.get_batch("open").cancelled == 1
    # Its member and callback are tasks, purged on their own: still listed by the batch's id,
    # still counting nowhere when retried and run again.
    assert sorted(t.task_id for t in executor.list_tasks(batch_id="old")) == ["old-0", "old-done"]
    assert executor.retry_task("old-0")
    run_all(executor)
    assert executor.get_task("old-0").status is TaskStatus.COMPLETED
    assert executor.get_batch("old") is None
    assert storage.purge_batches(clock.now(), 100) == 1  # "old2"; "open" is not finished
    assert executor.get_batch("open") is not None
    executor.purge_finished(clock.now() + dt.timedelta(seconds=1))
    assert executor.list_tasks(batch_id="old") == []
    assert [t.task_id for t in executor.list_tasks(batch_id="open")] == ["open-1"]


def test_a_member_of_a_purged_batch_never_counts_in_a_new_batch_of_the_same_id(
    executor, storage, clock
):
    """A batch id used again once its batch was purged: the old batch's members still stored
    (retried by hand, here) count in no batch when they end or are retried again, so the new
    batch finishes, and stores its callback, when its own member ends."""
    _finished_batch(executor, "again")  # member again-0, cancelled; callback again-done
    executor.submit_batch(members(1, prefix="old-"), batch_id="other")
    executor.cancel_task("old-0")  # a second purged batch's member, retried later
    clock.advance(10)
    assert storage.purge_batches(clock.now(), 100) == 2
    assert executor.retry_task("again-0")  # pending again, in no batch
    executor.submit_batch(
        members(1, prefix="new-"),
        batch_id="again",
        on_complete=TaskSubmitRequest("contract.hook", None, task_id="again-report"),
    )
    executor.submit_batch(members(1, prefix="new2-"), batch_id="other")
    executor.cancel_task("new2-0")
    assert executor.get_batch("other").finished
    assert executor.retry_task("old-0")  # no counter of the new "other" batch moves
    other = executor.get_batch("other")
    assert (other.total, other.cancelled, other.pending) == (1, 1, 0)

    claims = executor.storage.claim("w1", ["default"], 5, LEASE)
    run_claims(executor, [c for c in claims if c.task_id == "again-0"])
    assert executor.get_task("again-0").status is TaskStatus.COMPLETED
    info = executor.get_batch("again")
    assert (info.total, info.completed, info.pending, info.finished) == (1, 0, 1, False)
    assert executor.get_task("again-report") is None

    run_claims(executor, [c for c in claims if c.task_id == "new-0"])
    info = executor.get_batch("again")
    assert (info.total, info.completed, info.pending, info.finished) == (1, 1, 0, True)
    assert executor.get_task("again-report").status is TaskStatus.CREATED
    run_all(executor)  # the old member of "other" ends again: still nowhere
    other = executor.get_batch("other")
    assert (other.total, other.completed, other.cancelled) == (1, 0, 1)


def test_batch_purge_goes_oldest_first_limit_at_a_time(executor, storage, clock):
    for batch_id in ("b1", "b2", "b3"):
        _finished_batch(executor, batch_id)
        clock.advance(1)
    assert storage.purge_batches(clock.now(), 2) == 2
    assert [executor.get_batch(b) is None for b in ("b1", "b2", "b3")] == [True, True, False]
    assert executor.purge_batches(clock.now(), batch=1) == 1
    assert executor.get_batch("b3") is None
    with pytest.raises(ValueError, match="batch"):
        executor.purge_batches(clock.now(), batch=0)


def test_the_masters_purge_drops_batches_past_retention(executor, clock):
    _finished_batch(executor, "old")
    clock.advance(100)
    _finished_batch(executor, "young")
    _open_batch(executor, 1)
    clock.advance(60)
    MasterChores(executor, retention_seconds=120).run_once()
    assert executor.get_batch("old") is None
    assert executor.list_tasks(batch_id="old") == []  # its member and callback went first
    assert executor.get_batch("young").finished
    assert executor.get_batch("open").pending == 1


def test_a_batchs_members_are_claimed_in_request_order(executor, storage, clock):
    """Members are a microsecond apart, the last at the call's time: claims take them in
    request order (they shared one instant and came in task-id order on the databases)."""
    ids = [f"m{n}" for n in range(9, -1, -1)]
    executor.submit_batch([TaskSubmitRequest("demo.echo", {"i": i}, task_id=i) for i in ids])
    claimed = [c.task_id for _ in ids for c in storage.claim("w", ["default"], 1, LEASE)]
    assert claimed == ids
