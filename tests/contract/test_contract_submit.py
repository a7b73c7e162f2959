"""Contract: idempotent, batched and transactional submit, and the read API, on every database."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading

import pytest
from demo.models import Execution
from demo.tasks import OrderParam
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from django_reliable_executor import TaskStatus, TaskSubmitRequest, signals
from django_reliable_executor.exceptions import InvalidTaskOptionError
from django_reliable_executor.registry import rate_limits
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.contract_support import LEASE, claim_and_start, recording, total


def read_in_other_thread(executor: ReliableExecutor, task_id: str):
    """get_task from a separate connection: what other sessions see right now."""
    seen = []

    def read() -> None:
        try:
            seen.append(executor.get_task(task_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=read)
    thread.start()
    thread.join(30)
    assert len(seen) == 1
    return seen[0]


# -- idempotent submit ------------------------------------------------------------------------
def test_submit_stores_created_task_with_defaults(executor, clock):
    info = executor.submit("demo.echo", {"a": [1, 2.5, "x", None, True]}, task_id="t-1")
    assert info.task_id == "t-1"
    assert info.status is TaskStatus.CREATED
    assert info.parameter == {"a": [1, 2.5, "x", None, True]}
    assert (info.queue, info.priority, info.attempts) == ("default", 0, 0)
    assert (info.retry_limit, info.retry_interval, info.retry_backoff) == (3, 2000, "fixed")
    assert info.max_duration_millis is None
    assert info.created_at == clock.now() == info.run_at
    assert info.created_at.tzinfo is not None
    assert (info.started_at, info.finished_at, info.last_error, info.result) == (None,) * 4
    assert info.cancel_requested is False
    assert executor.get_task("t-1") == info


@pytest.mark.parametrize("in_atomic", [False, True], ids=["autocommit", "atomic"])
def test_submit_many_created_tells_which_tasks_this_call_stored(executor, db_alias, in_atomic):
    executor.submit("demo.echo", {"n": 1}, task_id="old")
    executor.submit("demo.echo", {"n": 2}, task_id="keyed", unique_for=60, unique_key="k")
    requests = [
        TaskSubmitRequest("demo.echo", {"n": 3}, task_id="old"),  # a taken id
        TaskSubmitRequest("demo.echo", {"n": 4}, unique_for=60, unique_key="k"),  # a held key
        TaskSubmitRequest("demo.echo", {"n": 5}, task_id="new"),
        TaskSubmitRequest(
            "demo.echo", {"n": 6}, task_id="new-keyed", unique_for=60, unique_key="j"
        ),
        TaskSubmitRequest("demo.echo", {"n": 7}, unique_for=60, unique_key="j"),  # held above
    ]
    with transaction.atomic(using=db_alias) if in_atomic else contextlib.nullcontext():
        answered = executor.submit_many_created(requests)
    assert [(info.task_id, created) for info, created in answered] == [
        ("old", False),
        ("keyed", False),
        ("new", True),
        ("new-keyed", True),
        ("new-keyed", False),  # answered by an earlier task of the same call
    ]
    assert [info.parameter for info, _ in answered[:3]] == [{"n": 1}, {"n": 2}, {"n": 5}]
    assert total(executor.count_by_status()) == 4


@pytest.mark.parametrize(
    "parameter",
    [
        None,
        True,
        0,
        -(2**63),
        2**70,
        1.5,
        0.1,
        -2.25,
        "",
        "zahlung über 100 € 😀 中文",
        [],
        {},
        {"nested": {"list": [1, "two", 3.5, None, False, {"deep": ["x"]}]}},
        {'quote"s': "back\\slash", "newline": "a\nb", "tab": "\t"},
    ],
    ids=lambda value: type(value).__name__,
)
def test_parameters_round_trip_unchanged(executor, parameter):
    executor.submit("demo.echo", parameter, task_id="rt")
    stored = executor.get_task("rt").parameter
    assert stored == parameter
    assert type(stored) is type(parameter)


def test_every_duration_option_also_takes_a_timedelta(executor, clock):
    """Milliseconds (seconds for unique_for) or a timedelta, at submit and in the decorator."""
    from django_reliable_executor import reliable_task_handler
    from django_reliable_executor.registry import unregister

    task = executor.submit(
        "demo.echo",
        1,
        retry_interval=dt.timedelta(seconds=2),
        max_duration_millis=dt.timedelta(minutes=10),
        delay_millis=dt.timedelta(seconds=30),
        unique_for=dt.timedelta(minutes=1),
    )
    assert (task.retry_interval, task.max_duration_millis) == (2000, 600_000)
    assert task.run_at == clock.now() + dt.timedelta(seconds=30)
    clock.advance(59)  # within the unique window of one minute
    assert executor.submit("demo.echo", 1, unique_for=60).task_id == task.task_id

    @reliable_task_handler(
        name="tests.timedelta_options",
        retry_interval=dt.timedelta(milliseconds=1500),
        max_duration_millis=dt.timedelta(seconds=5),
    )
    def handler() -> None: ...

    try:
        stored = executor.submit("tests.timedelta_options")
        assert (stored.retry_interval, stored.max_duration_millis) == (1500, 5000)
    finally:
        unregister("tests.timedelta_options")
    with pytest.raises(InvalidTaskOptionError, match="retry_interval must be"):
        executor.submit("demo.echo", 2, retry_interval=dt.timedelta(seconds=-1))


def test_submit_without_task_id_gets_a_fresh_uuid_hex(executor):
    first = executor.submit("demo.echo", 1)
    second = executor.submit("demo.echo", 1)
    assert first.task_id != second.task_id
    assert len(first.task_id) == 32
    int(first.task_id, 16)
    assert executor.count_by_status()[TaskStatus.CREATED] == 2


def test_submit_task_takes_a_request_and_handler_options_apply(executor):
    info = executor.submit_task(
        TaskSubmitRequest(
            task_name="demo.process_order",
            task_parameter=OrderParam(order_id=7, amount=9.5),
            task_id="order-7",
        )
    )
    assert info.parameter == {"order_id": 7, "amount": 9.5, "currency": "EUR"}
    assert info.retry_interval == 200  # from the decorator
    assert executor.get_task("order-7").parameter == info.parameter


def test_explicit_options_are_stored(executor, clock):
    info = executor.submit(
        "demo.echo",
        None,
        task_id="opts",
        retry_limit=7,
        retry_interval=1500,
        retry_backoff="exponential",
        max_duration_millis=60000,
        queue="mail",
        priority=-3,
        delay_millis=2500,
    )
    stored = executor.get_task("opts")
    assert stored == info
    assert (stored.retry_limit, stored.retry_interval, stored.retry_backoff) == (
        7,
        1500,
        "exponential",
    )
    assert (stored.max_duration_millis, stored.queue, stored.priority) == (60000, "mail", -3)
    assert stored.run_at == clock.now() + dt.timedelta(milliseconds=2500)


def test_the_rate_key_is_stored_and_read_back(executor, storage):
    """submit, get_task, list_tasks, a resubmit and a claim (rate-limited or not, started by it
    or not) all give the task's rate_key; None for a task without one."""
    keyed = executor.submit("demo.rated", {}, task_id="rk", rate_key="k", concurrency_key="c")
    assert (keyed.rate_key, keyed.concurrency_key) == ("k", "c")
    assert executor.get_task("rk") == keyed
    plain = executor.submit("demo.echo", None, task_id="no-rk")
    assert plain.rate_key is None and executor.get_task("no-rk") == plain
    [many] = executor.submit_many([TaskSubmitRequest("demo.echo", None, "rk-2", rate_key="k2")])
    assert many.rate_key == "k2" and executor.get_task("rk-2") == many
    assert executor.submit("demo.rated", {}, task_id="rk", rate_key="other") == keyed
    assert {t.task_id: t.rate_key for t in executor.list_tasks()} == {
        "rk": "k",
        "no-rk": None,
        "rk-2": "k2",
    }
    claims = storage.claim("w-1", ["default"], 10, LEASE, rate_limits=rate_limits(), start=1)
    assert {c.task_id: c.task.rate_key for c in claims} == {"rk": "k", "no-rk": None, "rk-2": "k2"}


def test_run_at_is_stored_in_utc(executor, clock):
    plus_two = dt.timezone(dt.timedelta(hours=2))
    when = (clock.now() + dt.timedelta(hours=1)).astimezone(plus_two)
    info = executor.submit("demo.echo", None, task_id="at", run_at=when)
    stored = executor.get_task("at")
    assert stored.run_at == when == info.run_at
    assert stored.run_at.utcoffset() == dt.timedelta(0)


def test_resubmitting_an_existing_id_returns_it_unchanged(executor, storage, clock):
    first = executor.submit("demo.echo", {"v": 1}, task_id="same", priority=1)
    clock.advance(5)
    again = executor.submit("demo.echo", {"v": 2}, task_id="same", priority=9, queue="other")
    assert again == first
    assert executor.get_task("same") == first
    assert total(executor.count_by_status()) == 1
    # Also once the task has moved on: resubmitting never resets or requeues it.
    claim_and_start(storage)
    third = executor.submit("demo.echo", {"v": 3}, task_id="same")
    assert third.status is TaskStatus.RUNNING
    assert third.parameter == {"v": 1}
    assert storage.claim("w2", ["default"], 10, 60) == []


def test_resubmit_sends_task_submitted_only_once(executor):
    with recording(signals.task_submitted) as rec:
        executor.submit("demo.echo", None, task_id="once")
        executor.submit("demo.echo", None, task_id="once")
        executor.submit_many([TaskSubmitRequest("demo.echo", task_id="once")])
    assert rec.calls == [
        {
            "sender": ReliableExecutor,
            "task_id": "once",
            "task_name": "demo.echo",
        }
    ]


def test_concurrent_submits_of_the_same_ids_store_each_once(executor):
    """Several threads race to submit one id and overlapping batches (in opposite orders)."""
    threads_n = 6
    batch_ids = [f"race-{k}" for k in range(8)]
    barrier = threading.Barrier(threads_n)
    singles: list = []
    batches: list = []
    errors: list[BaseException] = []

    def submit(i: int) -> None:
        ids = batch_ids if i % 2 else batch_ids[::-1]
        try:
            barrier.wait(10)
            singles.append(executor.submit("demo.echo", {"by": i}, task_id="race"))
            batch = [TaskSubmitRequest("demo.echo", {"by": i}, task_id=t) for t in ids]
            batches.append({info.task_id: info for info in executor.submit_many(batch)})
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connections.close_all()

    with recording(signals.task_submitted) as rec:
        threads = [threading.Thread(target=submit, args=(i,)) for i in range(threads_n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    stored = executor.get_task("race")
    assert singles == [stored] * threads_n  # everyone got the one stored task
    for task_id in batch_ids:
        assert [batch[task_id] for batch in batches] == [executor.get_task(task_id)] * threads_n
    assert total(executor.count_by_status()) == 1 + len(batch_ids)
    assert sorted(c["task_id"] for c in rec.calls) == sorted(["race", *batch_ids])


# -- submit_many ------------------------------------------------------------------------------
def test_submit_many_is_one_write_in_request_order(executor, alias, db_alias):
    requests = [TaskSubmitRequest("demo.echo", {"i": i}, task_id=f"b-{9 - i}") for i in range(10)]
    with CaptureQueriesContext(connections[db_alias]) as queries:
        infos = executor.submit_many(requests)
    inserts = [q["sql"] for q in queries.captured_queries if "INSERT INTO" in q["sql"]]
    assert len(inserts) == (0 if alias == "redis" else 1)  # Redis: one script call, no SQL
    assert [i.task_id for i in infos] == [f"b-{9 - i}" for i in range(10)]
    assert [i.parameter for i in infos] == [{"i": i} for i in range(10)]
    assert executor.count_by_status()[TaskStatus.CREATED] == 10
    for info in infos:
        assert executor.get_task(info.task_id) == info


def test_submit_many_tasks_are_claimed_in_request_order(executor, storage, clock):
    """The tasks of one call, due at once, are taken in request order (claims take the oldest
    first): each request is a microsecond after the one before, the last at the call's now, so
    none is in the future. Before, they shared one instant and came back in any order."""
    infos = executor.submit_many([TaskSubmitRequest("demo.echo", {"i": i}) for i in range(12)])
    assert infos[-1].created_at == clock.now()
    assert [i.created_at for i in infos] == sorted(i.created_at for i in infos)
    claimed = [c for n in range(12) for c in storage.claim(f"w{n}", ["default"], 1, LEASE)]
    assert [c.task.parameter["i"] for c in claimed] == list(range(12))


def test_submit_many_with_duplicates_and_existing_ids(executor):
    existing = executor.submit("demo.echo", "old", task_id="dup-0")
    with recording(signals.task_submitted) as rec:
        infos = executor.submit_many(
            [
                TaskSubmitRequest("demo.echo", "new-1", task_id="dup-1"),
                TaskSubmitRequest("demo.echo", "other", task_id="dup-0"),
                TaskSubmitRequest("demo.echo", "second copy", task_id="dup-1"),
                TaskSubmitRequest("demo.echo", "new-2", task_id="dup-2"),
            ]
        )
    assert [i.task_id for i in infos] == ["dup-1", "dup-0", "dup-1", "dup-2"]
    assert infos[1] == existing
    assert infos[0] == infos[2]
    assert infos[2].parameter == "new-1"  # the first request for an id wins
    assert executor.get_task("dup-1").parameter == "new-1"
    assert total(executor.count_by_status()) == 3
    assert sorted(c["task_id"] for c in rec.calls) == ["dup-1", "dup-2"]


def test_submit_many_empty_is_a_no_op(executor):
    assert executor.submit_many([]) == []
    assert total(executor.count_by_status()) == 0


# -- transactional submit ---------------------------------------------------------------------
def test_submit_commits_with_the_callers_transaction(executor, db_alias):
    with recording(signals.task_submitted) as rec, transaction.atomic(using=db_alias):
        Execution.objects.using(db_alias).create(task_id="biz", attempt=0, pid=0)
        info = executor.submit("demo.echo", None, task_id="tx-commit")
        assert (info.task_id, info.status) == ("tx-commit", TaskStatus.CREATED)  # id known now
        executor.submit_many([TaskSubmitRequest("demo.echo", task_id=f"tx-{i}") for i in range(2)])
        # The database storage writes in the transaction (visible inside it); Redis waits for
        # the commit.
        inside = executor.get_task("tx-commit")
        assert (inside is not None) == executor.storage.supports_transactional_enqueue
        assert read_in_other_thread(executor, "tx-commit") is None  # not yet outside it
        assert rec.calls == []  # no signal before commit
    assert read_in_other_thread(executor, "tx-commit").status is TaskStatus.CREATED
    assert sorted(c["task_id"] for c in rec.calls) == ["tx-0", "tx-1", "tx-commit"]


def test_submit_rolls_back_with_the_callers_transaction(executor, db_alias):
    class Boom(Exception):
        pass

    requests = [TaskSubmitRequest("demo.echo", task_id=f"rb-{i}") for i in (1, 2)]
    with (
        recording(signals.task_submitted) as rec,
        pytest.raises(Boom),
        transaction.atomic(using=db_alias),
    ):
        Execution.objects.using(db_alias).create(task_id="biz", attempt=0, pid=0)
        executor.submit("demo.echo", None, task_id="tx-rollback")
        executor.submit_many(requests)
        raise Boom
    assert executor.get_task("tx-rollback") is None
    assert executor.get_task("rb-1") is None
    assert total(executor.count_by_status()) == 0
    assert not Execution.objects.using(db_alias).exists()
    assert rec.calls == []


def test_duplicate_submit_inside_a_transaction_keeps_it_usable(executor, db_alias):
    executor.submit("demo.echo", "first", task_id="dup-tx")
    with transaction.atomic(using=db_alias):
        again = executor.submit("demo.echo", "second", task_id="dup-tx")
        both = executor.submit_many(
            [
                TaskSubmitRequest("demo.echo", task_id="dup-tx"),
                TaskSubmitRequest("demo.echo", task_id="fresh-tx"),
            ]
        )
        # The transaction is still usable after the duplicate insert was refused.
        Execution.objects.using(db_alias).create(task_id="after", attempt=0, pid=0)
    assert again.parameter == "first"
    assert [b.task_id for b in both] == ["dup-tx", "fresh-tx"]
    assert executor.get_task("fresh-tx") is not None
    assert Execution.objects.using(db_alias).filter(task_id="after").exists()
    assert executor.get_task("dup-tx").parameter == "first"


def test_a_rolled_back_inner_savepoint_drops_only_its_task(executor, db_alias):
    with transaction.atomic(using=db_alias):
        executor.submit("demo.echo", None, task_id="outer")
        try:
            with transaction.atomic(using=db_alias):
                executor.submit("demo.echo", None, task_id="inner")
                raise RuntimeError
        except RuntimeError:
            pass
    assert executor.get_task("outer") is not None
    assert executor.get_task("inner") is None


# -- reading ----------------------------------------------------------------------------------
def test_get_task_of_an_unknown_id_is_none(executor):
    executor.submit("demo.echo", None, task_id="known")
    assert executor.get_task("unknown") is None
    assert executor.get_task("") is None
    assert executor.get_task("known").task_id == "known"


def _populate(executor, clock):
    """Six tasks, one second apart: names, queues and statuses vary."""
    specs = [
        ("l-0", "demo.echo", "default"),
        ("l-1", "demo.noop", "default"),
        ("l-2", "demo.echo", "mail"),
        ("l-3", "demo.echo", "default"),
        ("l-4", "demo.noop", "mail"),
        ("l-5", "demo.echo", "default"),
    ]
    for task_id, name, queue in specs:
        executor.submit(name, None, task_id=task_id, queue=queue)
        clock.advance(1)
    executor.cancel_task("l-1")
    executor.cancel_task("l-3")


def test_list_tasks_newest_first_with_limit_and_offset(executor, clock):
    _populate(executor, clock)
    ids = [t.task_id for t in executor.list_tasks()]
    assert ids == ["l-5", "l-4", "l-3", "l-2", "l-1", "l-0"]
    assert [t.task_id for t in executor.list_tasks(limit=2)] == ["l-5", "l-4"]
    assert [t.task_id for t in executor.list_tasks(limit=2, offset=3)] == ["l-2", "l-1"]
    assert executor.list_tasks(offset=6) == []
    assert executor.list_tasks(limit=0) == []


def test_list_tasks_filters(executor, clock):
    _populate(executor, clock)

    def ids(**filters):
        return [t.task_id for t in executor.list_tasks(**filters)]

    assert ids(status=TaskStatus.CANCELLED) == ["l-3", "l-1"]
    assert ids(status="CREATED") == ["l-5", "l-4", "l-2", "l-0"]
    assert ids(task_name="demo.noop") == ["l-4", "l-1"]
    assert ids(queue="mail") == ["l-4", "l-2"]
    assert ids(queue="mail", task_name="demo.echo") == ["l-2"]
    assert ids(status="CANCELLED", queue="default", task_name="demo.noop") == ["l-1"]
    assert ids(queue="nowhere") == []
    assert ids(status=TaskStatus.FAILED) == []


def test_list_tasks_rejects_bad_arguments(executor):
    with pytest.raises(ValueError, match="status"):
        executor.list_tasks(status="SLEEPING")
    with pytest.raises(ValueError, match="limit"):
        executor.list_tasks(limit=-1)
    with pytest.raises(ValueError, match="offset"):
        executor.list_tasks(offset=-1)
    # Past a signed 64-bit LIMIT once added to the offset: refused, not sent to the storage.
    with pytest.raises(
        ValueError, match=r"limit must be at most 10\*\*18, got 9223372036854775808"
    ):
        executor.list_tasks(limit=2**63)
    assert executor.list_tasks(offset=2**63, limit=10**18) == []  # past any task: nothing


def test_count_by_status_lists_every_status(executor, clock):
    assert executor.count_by_status() == {status: 0 for status in TaskStatus}
    _populate(executor, clock)
    counts = executor.count_by_status()
    assert set(counts) == set(TaskStatus)
    assert counts[TaskStatus.CREATED] == 4
    assert counts[TaskStatus.CANCELLED] == 2
    assert counts[TaskStatus.RUNNING] == counts[TaskStatus.ERROR] == 0
    mail = executor.count_by_status(queue="mail")
    assert set(mail) == set(TaskStatus)
    assert (mail[TaskStatus.CREATED], mail[TaskStatus.CANCELLED]) == (2, 0)
    assert total(executor.count_by_status(queue="nowhere")) == 0


def test_task_ids_are_exact_whatever_the_server_collation(executor):
    """MySQL's default collation would fold case and accents; ids must stay distinct."""
    ids = ["order-A", "order-a", "café", "cafe"]
    for task_id in ids:
        assert executor.submit("demo.echo", {"id": task_id}, task_id=task_id).task_id == task_id
    assert sorted(t.task_id for t in executor.list_tasks()) == sorted(ids)
    assert executor.get_task("order-a").parameter == {"id": "order-a"}
