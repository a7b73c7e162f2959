"""Durable steps (context.step): a step's result is stored once per task and given back to later
attempts, each checkpoint written under the attempt's token (renewing its lease), read back as
TaskInfo.steps, purged with its task, discarded by retry_task(from_step=...); atomic=True on the
database storage commits the step's ORM writes exactly with its checkpoint."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest
from asgiref.sync import SyncToAsync
from demo.models import Execution
from django.db import connections

from django_reliable_executor import (
    DuplicateStepError,
    LeaseLostError,
    StepInfo,
    TaskStatus,
    UnknownStepError,
)
from django_reliable_executor.core.records import copy_with
from django_reliable_executor.core.serialization import ConversionError, encode
from django_reliable_executor.exceptions import InvalidTaskOptionError
from django_reliable_executor.worker.event_loop import EventLoop
from tests.conftest import DB_ALIASES, db_params, require
from tests.support.contract_support import (
    HOOKS,
    LEASE,
    claim_and_start,
    claim_one,
    run_claim,
    task_runner,
)


def steps_of(executor, task_id):
    return [step.name for step in executor.get_task(task_id).steps]


def run_again(executor, clock):
    """Let the retry fall due, then claim and run it."""
    clock.advance(2)
    return run_claim(executor, claim_one(executor.storage))


def counting(calls, name, value):
    """A step function that counts its calls under ``name`` and returns ``value``."""

    def fn(*args, **kwargs):
        calls.append((name, args, kwargs))
        return value

    return fn


# -- stored once, given back ------------------------------------------------------------------
def test_a_later_attempt_gets_a_stored_step_back_without_running_it(executor, clock):
    executor.submit("contract.hook", None, task_id="s")
    calls: list = []
    seen: list = []

    def handler(context):
        one = context.step("one", counting(calls, "one", (1, "a")), 5, key="k")
        seen.append((context.attempt, one))
        if context.attempt == 1:
            raise ConnectionError("after step one")
        two = context.step("two", counting(calls, "two", {"b": 2}))
        return [one, two]

    HOOKS["s"] = handler
    first_done = clock.now()
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    info = executor.get_task("s")
    assert info.steps == (StepInfo("one", first_done),)
    assert run_again(executor, clock) is TaskStatus.COMPLETED
    # fn ran once per step; the stored value (JSON: the tuple is a list) came back the same in
    # both attempts
    assert calls == [("one", (5,), {"key": "k"}), ("two", (), {})]
    assert seen == [(1, [1, "a"]), (2, [1, "a"])]
    info = executor.get_task("s")
    assert info.result == [[1, "a"], {"b": 2}]
    assert [s.name for s in info.steps] == ["one", "two"]
    assert info.steps[1].finished_at == clock.now()
    assert executor.storage.step_results("s") == {"one": [1, "a"], "two": {"b": 2}}


def test_a_synchronous_handler_s_step_runs_at_once_even_where_an_event_loop_runs(
    executor, monkeypatch
):
    # A synchronous handler called from a thread that runs an event loop (an async test, a
    # browser driver): its step is the synchronous form, by the handler's kind, not by the
    # thread's loop. (The ORM's async guard is lifted, as a test driving one would.)
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    executor.submit("contract.hook", None, task_id="in-loop")
    calls: list = []

    def handler(context):
        return context.step("one", counting(calls, "one", 1))

    HOOKS["in-loop"] = handler

    async def in_a_running_loop():
        return run_claim(executor, claim_one(executor.storage))

    assert asyncio.run(in_a_running_loop()) is TaskStatus.COMPLETED
    assert executor.get_task("in-loop").result == 1
    assert calls == [("one", (), {})]


def test_a_failing_step_stores_nothing_and_runs_again(executor, clock):
    executor.submit("contract.hook", None, task_id="f")
    calls: list = []

    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("first call fails")
        return "ok"

    HOOKS["f"] = lambda context: context.step("flaky", flaky)
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    task = executor.get_task("f")
    assert task.steps == ()
    assert "first call fails" in task.last_error
    assert executor.storage.step_results("f") == {}
    assert run_again(executor, clock) is TaskStatus.COMPLETED
    assert len(calls) == 2
    assert executor.get_task("f").result == "ok"


def test_a_step_result_no_storage_can_take_is_refused_with_the_task_results_words(executor):
    executor.submit("contract.hook", None, task_id="bad")
    raised: list[BaseException] = []

    def handler(context):
        try:
            context.step("set", lambda: {1, 2})
        except ConversionError as exc:
            raised.append(exc)
        return "done"

    HOOKS["bad"] = handler
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.COMPLETED
    assert len(raised) == 1
    assert "step 'set': result cannot be stored" in str(raised[0])
    assert isinstance(raised[0], ValueError)
    assert executor.get_task("bad").steps == ()


def test_a_step_name_used_twice_in_one_run_is_refused_naming_it(executor):
    executor.submit("contract.hook", None, task_id="dup")
    outcomes: list = []

    def handler(context):
        context.step("same", lambda: 1)
        try:
            context.step("same", lambda: 2)
        except DuplicateStepError as exc:
            outcomes.append(str(exc))
        # one that raised may be called again in the same run (the handler retries it)
        for attempt in range(2):
            try:
                outcomes.append(context.step("retried", _fails_first(attempt)))
            except RuntimeError:
                outcomes.append("raised")
        with pytest.raises(ValueError, match="non-empty"):
            context.step("", lambda: 3)
        with pytest.raises(TypeError):
            context.step(7, lambda: 3)

        async def coroutine_function():
            return 1

        with pytest.raises(TypeError, match="async def"):  # a sync handler cannot await it
            context.step("async", coroutine_function)
        return "done"

    HOOKS["dup"] = handler
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.COMPLETED
    assert "'same'" in outcomes[0] and "already ran" in outcomes[0]
    assert outcomes[1:] == ["raised", "second"]
    assert steps_of(executor, "dup") == ["same", "retried"]


def _fails_first(attempt):
    def fn():
        if attempt == 0:
            raise RuntimeError("first")
        return "second"

    return fn


# -- fenced by the claim's token, renewing its lease ------------------------------------------
def test_a_checkpoint_is_fenced_by_the_claims_token(executor, storage):
    executor.submit("demo.echo", 1, task_id="t")
    claim = claim_and_start(storage)
    stale = copy_with(claim, token=claim.token + 1)
    other_worker = copy_with(claim, task=copy_with(claim.task, worker_id="w2"))
    assert storage.record_step(stale, "a", encode(1), LEASE) is False
    assert storage.record_step(other_worker, "a", encode(1), LEASE) is False
    assert storage.step_results("t") == {}
    assert storage.record_step(claim, "a", encode({"x": 1}), LEASE) is True
    assert storage.step_results("t") == {"a": {"x": 1}}


def test_a_checkpoint_of_an_attempt_whose_lease_was_lost_raises_lease_lost(
    executor, storage, clock
):
    executor.submit("contract.hook", None, task_id="lost")
    raised: list[BaseException] = []
    ran: list[str] = []

    def handler(context):
        context.step("before", lambda: "kept")
        # the worker is taken for dead: its lease lapses and the master recovers the task
        clock.advance(LEASE + 1)
        assert [t.task.task_id for t in storage.recover_expired(10)] == ["lost"]
        try:
            context.step("after", lambda: ran.append("after") or "lost")
        except LeaseLostError as exc:
            raised.append(exc)
            raise

    HOOKS["lost"] = handler
    run_claim(executor, claim_one(storage))
    assert ran == ["after"]  # fn ran; its checkpoint was refused
    assert len(raised) == 1 and "no longer holds" in str(raised[0])
    assert raised[0].task_id == "lost"
    info = executor.get_task("lost")
    assert info.status is TaskStatus.PENDING  # the recovery's doing; the stale outcome refused
    assert [s.name for s in info.steps] == ["before"]


def test_a_checkpoint_renews_the_lease(executor, storage, clock):
    executor.submit("demo.echo", 1, task_id="renewed")
    executor.submit("demo.echo", 2, task_id="idle")
    claims = {
        c.task_id: c for c in storage.start_many(storage.claim("w1", ["default"], 2, LEASE), LEASE)
    }
    clock.advance(LEASE - 10)
    assert storage.record_step(claims["renewed"], "a", encode(1), LEASE) is True
    clock.advance(20)  # past the first lease, within the one the checkpoint renewed
    recovered = [t.task.task_id for t in storage.recover_expired(10)]
    assert recovered == ["idle"]
    assert executor.get_task("renewed").status is TaskStatus.RUNNING


def test_a_checkpoint_that_skips_the_renewal_is_fenced_all_the_same(executor, storage):
    executor.submit("demo.echo", 1, task_id="t")
    claim = claim_and_start(storage)
    stale = copy_with(claim, token=claim.token + 1)
    assert storage.record_step(stale, "a", encode(1), LEASE, renew_lease=False) is False
    assert storage.step_results("t") == {}
    assert storage.record_step(claim, "a", encode(1), LEASE, renew_lease=False) is True
    assert storage.step_results("t") == {"a": 1}


def test_steps_keep_the_lease_at_least_three_quarters_full(executor, storage, clock):
    """A checkpoint renews the lease once a quarter of it has passed since the attempt last
    renewed it (MariaDB and SQLite skip the statement before that)."""
    from django_reliable_executor.worker.steps import Checkpoints

    executor.submit("demo.echo", 1, task_id="kept")
    executor.submit("demo.echo", 2, task_id="idle")
    claims = {
        c.task_id: c for c in storage.start_many(storage.claim("w1", ["default"], 2, LEASE), LEASE)
    }
    steps = Checkpoints(claims["kept"], executor, LEASE)
    for index in range(8):  # a step every tenth of a lease
        clock.advance(LEASE / 10)
        assert steps.run(f"s{index}", lambda: 1, (), {}, False) == 1
    # 0.8 of a lease since the start (the first lease is gone by then), and at least 0.75 of
    # one left after the last step
    clock.advance(LEASE * 0.75 - 0.5)
    assert [t.task.task_id for t in storage.recover_expired(10)] == ["idle"]
    assert executor.get_task("kept").status is TaskStatus.RUNNING


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))
def test_a_renewal_rolled_back_with_the_handlers_transaction_is_not_counted(
    executor, storage, clock, alias
):
    require(alias)
    from django.db import transaction

    from django_reliable_executor.worker.steps import Checkpoints

    executor.submit("demo.echo", 1, task_id="undone")
    claim = claim_and_start(storage)
    steps = Checkpoints(claim, executor, LEASE)
    clock.advance(LEASE * 0.3)
    with pytest.raises(ZeroDivisionError), transaction.atomic(using=storage.transaction_alias):
        steps.run("a", lambda: 1, (), {}, False)  # renews the lease, then rolls back
        raise ZeroDivisionError
    assert storage.step_results("undone") == {}
    steps.run("b", lambda: 2, (), {}, False)  # so this one renews it again
    clock.advance(LEASE * 0.75 - 0.5)  # past the start's lease, within b's
    assert storage.recover_expired(10) == []
    assert executor.get_task("undone").status is TaskStatus.RUNNING


# -- read back, purged ------------------------------------------------------------------------
def test_steps_are_read_by_get_get_many_and_listings(executor, storage, clock):
    for task_id in ("m1", "m2"):
        executor.submit("demo.echo", 1, task_id=task_id)
    claims = {
        c.task_id: c for c in storage.start_many(storage.claim("w1", ["default"], 2, LEASE), LEASE)
    }
    first = clock.now()
    assert storage.record_step(claims["m1"], "b", encode(1), LEASE)
    later = clock.advance(1)
    assert storage.record_step(claims["m1"], "a", encode(2), LEASE)
    both = storage.get_many(["m1", "m2", "unknown"])
    assert both["m1"].steps == (StepInfo("b", first), StepInfo("a", later))
    assert both["m2"].steps == ()
    assert executor.get_task("m1").steps == both["m1"].steps
    listed = {task.task_id: task.steps for task in executor.list_tasks()}
    assert listed == {"m1": both["m1"].steps, "m2": ()}
    # stored again: replaced, and last in the order
    assert storage.record_step(claims["m1"], "b", encode(3), LEASE)
    assert steps_of(executor, "m1") == ["a", "b"]
    assert storage.step_results("m1") == {"a": 2, "b": 3}


def test_the_purge_removes_a_tasks_steps_with_it(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="gone")
    executor.submit("contract.hook", None, task_id="kept", queue="other")
    HOOKS["gone"] = HOOKS["kept"] = lambda context: context.step("one", lambda: 1)
    assert run_claim(executor, claim_one(storage)) is TaskStatus.COMPLETED
    clock.advance(10)
    assert run_claim(executor, claim_one(storage, queue="other")) is TaskStatus.COMPLETED
    assert storage.purge_finished(clock.now() - dt.timedelta(seconds=5), 10) == 1
    assert executor.get_task("gone") is None
    assert storage.step_results("gone") == {}
    assert storage.step_results("kept") == {"one": 1}
    # the same id submitted again starts without checkpoints
    executor.submit("contract.hook", None, task_id="gone")
    assert executor.get_task("gone").steps == ()
    assert storage.step_results("gone") == {}


# -- retry from a step ------------------------------------------------------------------------
def _three_steps(calls):
    def handler(context):
        values = [context.step(name, counting(calls, name, name.upper())) for name in "abc"]
        if context.attempt == 1:
            raise RuntimeError("fails after its steps")
        return values

    return handler


def test_retry_from_a_step_discards_it_and_the_steps_after_it(executor, clock):
    executor.submit("contract.hook", None, task_id="r", retry_limit=0)
    calls: list = []
    HOOKS["r"] = _three_steps(calls)
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.FAILED
    assert steps_of(executor, "r") == ["a", "b", "c"]
    assert executor.retry_task("r", from_step="b") is True
    task = executor.get_task("r")
    assert task.status is TaskStatus.PENDING
    assert [s.name for s in task.steps] == ["a"]
    calls.clear()
    assert run_again(executor, clock) is TaskStatus.COMPLETED
    assert [name for name, _, _ in calls] == ["b", "c"]  # a's stored result came back
    assert steps_of(executor, "r") == ["a", "b", "c"]
    assert executor.get_task("r").result == ["A", "B", "C"]


def test_a_plain_retry_keeps_every_step(executor, clock):
    executor.submit("contract.hook", None, task_id="p", retry_limit=0)
    calls: list = []
    HOOKS["p"] = _three_steps(calls)
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.FAILED
    calls.clear()
    assert executor.retry_task("p") is True
    assert run_again(executor, clock) is TaskStatus.COMPLETED
    assert calls == []


def test_retry_from_an_unknown_step_is_refused_and_changes_nothing(executor):
    executor.submit("contract.hook", None, task_id="u", retry_limit=0)
    HOOKS["u"] = _three_steps([])
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.FAILED
    before = executor.get_task("u")
    with pytest.raises(UnknownStepError) as raised:
        executor.retry_task("u", from_step="B")
    assert "'B'" in str(raised.value) and "'a', 'b', 'c'" in str(raised.value)
    assert isinstance(raised.value, ValueError)
    assert executor.get_task("u") == before
    with pytest.raises(ValueError, match="from_step"):
        executor.retry_task("u", from_step="")


def test_retry_from_a_step_of_a_task_that_cannot_be_retried_changes_nothing(executor, storage):
    executor.submit("demo.echo", 1, task_id="running")
    claim = claim_and_start(storage)
    assert storage.record_step(claim, "a", encode(1), LEASE)
    assert executor.retry_task("running", from_step="a") is False
    assert storage.step_results("running") == {"a": 1}


# -- atomic=True ------------------------------------------------------------------------------
def test_an_atomic_step_commits_its_orm_writes_exactly_with_its_checkpoint(
    executor, storage, clock, alias
):
    executor.submit("contract.hook", None, task_id="at")
    outcomes: list = []

    def write_row(context, tag):
        Execution.objects.using(storage.transaction_alias).create(
            task_id=f"at-{tag}", attempt=context.attempt, pid=0
        )
        return tag

    def handler(context):
        try:
            outcomes.append(context.step("kept", write_row, context, "kept", atomic=True))
        except InvalidTaskOptionError as exc:
            outcomes.append(exc)
            return "refused"
        # then this attempt loses its lease: the next atomic step's writes roll back with its
        # refused checkpoint
        clock.advance(LEASE + 1)
        storage.recover_expired(10)
        try:
            context.step("lost", write_row, context, "lost", atomic=True)
        except LeaseLostError as exc:
            outcomes.append(type(exc))
        # and a step that raises rolls its writes back (nothing stored)
        try:
            context.step("raises", lambda: write_row(context, "raises") and 1 / 0, atomic=True)
        except (ZeroDivisionError, LeaseLostError) as exc:
            outcomes.append(type(exc))
        return "done"

    HOOKS["at"] = handler
    run_claim(executor, claim_one(storage))
    if alias == "redis":
        (refused,) = outcomes
        assert refused.field == "atomic"
        assert "atomic=True needs the database storage" in str(refused)
        assert executor.get_task("at").steps == ()
        assert not Execution.objects.filter(task_id__startswith="at-").exists()
        return
    assert outcomes == ["kept", LeaseLostError, ZeroDivisionError]
    rows = Execution.objects.using(storage.transaction_alias).filter(task_id__startswith="at-")
    assert sorted(rows.values_list("task_id", flat=True)) == ["at-kept"]
    assert steps_of(executor, "at") == ["kept"]


@pytest.mark.parametrize("alias", db_params(DB_ALIASES))  # Redis refuses it: the test above
def test_an_atomic_step_rolls_back_when_its_checkpoint_is_refused(executor, storage, alias):
    require(alias)
    from django.db import transaction

    from django_reliable_executor.worker.steps import Checkpoints

    executor.submit("demo.echo", 1, task_id="fenced")
    claim = claim_and_start(storage)
    stale = Checkpoints(copy_with(claim, token=claim.token + 1), executor, LEASE)
    db = storage.transaction_alias

    def write():
        Execution.objects.using(db).create(task_id="fenced-row", attempt=1, pid=0)
        return 1

    with pytest.raises(LeaseLostError):
        stale.run("s", write, (), {}, True)
    assert not Execution.objects.using(db).filter(task_id="fenced-row").exists()
    assert storage.step_results("fenced") == {}
    assert not transaction.get_connection(db).in_atomic_block
    fresh = Checkpoints(claim, executor, LEASE)
    assert fresh.run("s", write, (), {}, True) == 1
    assert Execution.objects.using(db).filter(task_id="fenced-row").count() == 1
    assert storage.step_results("fenced") == {"s": 1}


# -- async handlers on the worker's event loop ------------------------------------------------
def test_async_handlers_await_their_steps_on_the_event_loop(executor, storage, clock):
    executor.submit("contract.async_hook", None, task_id="as")
    calls: list = []

    async def fetch(value):
        calls.append(("fetch", value))
        return {"fetched": value}

    def sync_part():
        calls.append(("sync", None))
        return "sync"

    async def handler(context):
        one = await context.step("fetch", fetch, 7)
        two = await context.step("sync", sync_part)
        if context.attempt == 1:
            raise ConnectionError("after two steps")
        return [one, two]

    HOOKS["as"] = handler

    def run_on_loop():
        done = threading.Event()
        with task_runner(executor) as runner:
            loop = EventLoop(runner)
            try:
                loop.run([claim_one(storage)], lambda claim: done.set())
                assert done.wait(30)
            finally:
                loop.stop()
                # the steps' storage calls ran in asgiref's thread for thread-sensitive calls:
                # close its connections, or the test database cannot be dropped at the end
                SyncToAsync.single_thread_executor.submit(connections.close_all).result()

    run_on_loop()
    assert steps_of(executor, "as") == ["fetch", "sync"]
    assert executor.get_task("as").status is TaskStatus.PENDING
    clock.advance(2)
    run_on_loop()
    task = executor.get_task("as")
    assert task.status is TaskStatus.COMPLETED, task.last_error
    assert task.result == [{"fetched": 7}, "sync"]
    assert calls == [("fetch", 7), ("sync", None)]
