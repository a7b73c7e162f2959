"""Dependencies and chains on every storage: a dependent waits CREATED and unclaimable until its
dependencies end, is released or cancelled by the very write that ends the last of them, and
bad input stores nothing."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from django_reliable_executor import InvalidDependencyError, TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.dependencies import WAITING_RUN_AT
from tests.support.contract_support import (
    HOOKS,
    LEASE,
    claim_and_start,
    claim_one,
    raising,
    run_claim,
    run_claims,
)


def claimable(storage) -> list[str]:
    """The ids a claim takes now (handed back at once)."""
    claims = storage.claim("peek", ["default"], 50, LEASE)
    storage.release(claims)
    return sorted(c.task_id for c in claims)


def finish(executor, task_id: str, result=None) -> None:
    """Claim, start and complete exactly ``task_id`` (the only due task)."""
    claim = claim_and_start(executor.storage)
    assert claim.task_id == task_id
    assert executor.storage.complete(claim, result) is not None


def test_a_dependent_waits_until_its_last_dependency_completes(executor, storage):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b")
    info = executor.submit("contract.hook", None, task_id="c", depends_on=["a", "b", "a"])
    assert info.status is TaskStatus.CREATED
    assert info.depends_on == ("a", "b")  # duplicates folded
    assert info.waiting_for == ("a", "b")
    assert info.run_at == WAITING_RUN_AT
    assert claimable(storage) == ["a", "b"]

    claim = storage.claim("w1", ["default"], 1, LEASE)[0]
    started = storage.start(claim, LEASE)
    storage.complete(started, {"from": started.task_id})
    waiting = executor.get_task("c")
    assert waiting.status is TaskStatus.CREATED
    other = "b" if started.task_id == "a" else "a"
    assert waiting.waiting_for == (other,)
    assert claimable(storage) == [other]

    finish(executor, other, {"from": other})
    released = executor.get_task("c")
    assert released.status is TaskStatus.CREATED
    assert released.waiting_for == ()
    assert released.run_at <= executor.clock.now()
    assert claimable(storage) == ["c"]


def test_dependency_results_map_each_dependency_to_its_result(executor, storage):
    executor.submit("contract.hook", None, task_id="order")
    executor.submit("contract.hook", None, task_id="stock")
    executor.submit("contract.hook", None, task_id="charge", depends_on=["order", "stock"])
    HOOKS["order"] = lambda context: {"total": 42}
    HOOKS["stock"] = lambda context: None
    seen = []
    HOOKS["charge"] = lambda context: seen.append(context.dependency_results) or "charged"
    both = storage.claim("w1", ["default"], 10, LEASE)
    assert run_claims(executor, both) == [TaskStatus.COMPLETED] * 2
    assert run_claim(executor, claim_one(storage)) is TaskStatus.COMPLETED
    assert seen == [{"order": {"total": 42}, "stock": None}]


@pytest.mark.parametrize("ending", ["fail", "cancel", "expire", "error"])
def test_a_dependency_ending_badly_cancels_the_dependent_and_its_own_dependents(
    executor, storage, clock, ending
):
    executor.submit("contract.hook", None, task_id="a", retry_limit=0, max_duration_millis=1000)
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    executor.submit("contract.hook", None, task_id="c", depends_on=["b"])
    executor.submit(
        "contract.hook", None, task_id="d", depends_on=["a"], on_dependency_failure="run"
    )
    if ending == "cancel":
        assert executor.cancel_task("a")
        expected = TaskStatus.CANCELLED
    elif ending == "expire":
        clock.advance(2)
        assert [t.task.task_id for t in storage.expire_overdue(10)] == ["a"]
        expected = TaskStatus.TIMEOUT
    elif ending == "error":
        claim = claim_and_start(storage)
        assert storage.fail(claim, "no handler", retryable=False, is_error=True) is not None
        expected = TaskStatus.ERROR
    else:
        HOOKS["a"] = raising(RuntimeError("boom"))
        assert run_claim(executor, claim_one(storage)) is TaskStatus.FAILED
        expected = TaskStatus.FAILED
    b, c, d = (executor.get_task(i) for i in "bcd")
    assert b.status is TaskStatus.CANCELLED
    assert "dependency a" in b.last_error and expected.value in b.last_error
    assert c.status is TaskStatus.CANCELLED and "dependency b" in c.last_error
    assert d.status is TaskStatus.CREATED and d.waiting_for == ()  # "run": released anyway
    assert claimable(storage) == ["d"]


def test_worker_lost_for_good_cancels_the_dependent(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="a", retry_limit=0)
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    claim_and_start(storage)
    clock.advance(LEASE + 1)
    assert [t.status for t in storage.recover_expired(10)] == [TaskStatus.FAILED]
    assert executor.get_task("b").status is TaskStatus.CANCELLED


def test_an_unstarted_claim_expiring_cancels_the_dependent(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="a", max_duration_millis=1000)
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    claim = claim_one(storage)
    clock.advance(2)
    assert storage.expire_claim(claim) is not None
    assert executor.get_task("b").status is TaskStatus.CANCELLED


def test_dependencies_already_ended_at_submit(executor, storage):
    executor.submit("contract.hook", None, task_id="done")
    finish(executor, "done", 7)
    executor.submit("contract.hook", None, task_id="gone")
    executor.cancel_task("gone")

    due = executor.submit("contract.hook", None, task_id="x", depends_on=["done"])
    assert due.status is TaskStatus.CREATED and due.waiting_for == ()
    assert claimable(storage) == ["x"]
    cancelled = executor.submit("contract.hook", None, task_id="y", depends_on=["done", "gone"])
    assert cancelled.status is TaskStatus.CANCELLED
    assert "dependency gone ended CANCELLED" in cancelled.last_error
    runs = executor.submit(
        "contract.hook", None, task_id="z", depends_on=["gone"], on_dependency_failure="run"
    )
    assert runs.status is TaskStatus.CREATED and runs.waiting_for == ()
    assert claimable(storage) == ["x", "z"]


def test_a_dependent_does_not_count_against_max_duration_until_released(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"], max_duration_millis=5000)
    clock.advance(60)
    assert storage.expire_overdue(10) == []
    finish(executor, "a")
    clock.advance(4)
    assert storage.expire_overdue(10) == []
    clock.advance(2)
    assert [t.task.task_id for t in storage.expire_overdue(10)] == ["b"]


def test_chain_runs_steps_in_order_and_a_failed_step_cancels_the_rest(executor, storage):
    steps = executor.chain(
        [
            TaskSubmitRequest("contract.hook", task_id="order"),
            TaskSubmitRequest("contract.hook", task_id="charge", retry_limit=0),
            TaskSubmitRequest("contract.hook", task_id="email"),
        ]
    )
    assert [s.task_id for s in steps] == ["order", "charge", "email"]
    assert [s.depends_on for s in steps] == [(), ("order",), ("charge",)]
    assert claimable(storage) == ["order"]
    finish(executor, "order")
    assert claimable(storage) == ["charge"]
    HOOKS["charge"] = raising(RuntimeError("card declined"))
    assert run_claim(executor, claim_one(storage)) is TaskStatus.FAILED
    email = executor.get_task("email")
    assert email.status is TaskStatus.CANCELLED and "dependency charge" in email.last_error


def test_chain_gives_ids_to_steps_without_one(executor):
    steps = executor.chain([TaskSubmitRequest("contract.hook"), TaskSubmitRequest("contract.hook")])
    assert steps[1].depends_on == (steps[0].task_id,)


def test_retrying_a_failed_dependency_does_not_revive_cancelled_dependents(executor, storage):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    executor.cancel_task("a")
    assert executor.get_task("b").status is TaskStatus.CANCELLED
    assert executor.retry_task("a")
    finish(executor, "a")
    assert executor.get_task("b").status is TaskStatus.CANCELLED
    assert executor.retry_task("b")  # retried by hand too: runs at once
    b = executor.get_task("b")
    assert b.status is TaskStatus.PENDING and b.waiting_for == ()
    assert claimable(storage) == ["b"]


def test_a_dependent_cancelled_while_it_waits_and_retried_waits_again(executor, storage):
    executor.submit("contract.hook", None, task_id="z")
    finish(executor, "z")
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b", depends_on=["a", "z"])
    assert executor.cancel_task("b")
    assert executor.retry_task_or_reason("b") is None
    b = executor.get_task("b")
    assert b.status is TaskStatus.CREATED and b.waiting_for == ("a",)
    assert b.run_at == WAITING_RUN_AT
    assert claimable(storage) == ["a"]  # not b: its dependency has not ended
    finish(executor, "a", "done")
    assert executor.get_task("b").status is TaskStatus.CREATED  # due now, not claimed yet
    assert executor.get_task("b").waiting_for == ()
    assert claimable(storage) == ["b"]


def test_retrying_a_dependent_whose_dependency_failed_is_refused_saying_why(executor, storage):
    executor.submit("contract.hook", None, task_id="a", retry_limit=0)
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    executor.submit(
        "contract.hook", None, task_id="runs", depends_on=["a"], on_dependency_failure="run"
    )
    assert executor.cancel_task("runs")
    HOOKS["a"] = raising(ValueError("a broke"))
    assert run_claim(executor, claim_one(storage)) is TaskStatus.FAILED
    assert executor.get_task("b").status is TaskStatus.CANCELLED
    reason = executor.retry_task_or_reason("b")
    assert reason is not None and "dependency a ended FAILED" in reason
    assert not executor.retry_task("b")
    b = executor.get_task("b")
    assert b.status is TaskStatus.CANCELLED and "dependency a ended FAILED" in b.last_error
    # A dependent that runs on failure runs: its dependency has ended.
    assert executor.retry_task_or_reason("runs") is None
    assert executor.get_task("runs").status is TaskStatus.PENDING
    assert claimable(storage) == ["runs"]
    # The dependency retried first: the dependent then waits for its new run.
    assert executor.retry_task("a")
    assert executor.retry_task_or_reason("b") is None
    assert executor.get_task("b").waiting_for == ("a",)
    assert claimable(storage) == ["a", "runs"]


def test_retrying_a_dependent_whose_dependency_was_purged_is_refused(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    assert executor.cancel_task("b")
    finish(executor, "a")
    clock.advance(10)
    assert storage.purge_finished(clock.now(), 10, frozenset({TaskStatus.COMPLETED})) == 1
    reason = executor.retry_task_or_reason("b")
    assert reason is not None and "dependency a is no longer stored (purged)" in reason
    assert executor.get_task("b").status is TaskStatus.CANCELLED


def test_cancelling_a_waiting_dependent(executor, storage):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    assert executor.cancel_task("b")
    finish(executor, "a")
    assert executor.get_task("b").status is TaskStatus.CANCELLED
    assert claimable(storage) == []


def test_an_existing_task_id_is_returned_unchanged(executor):
    executor.submit("contract.hook", None, task_id="a")
    first = executor.submit("contract.hook", None, task_id="b")
    again = executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    assert again.depends_on == () and again == first


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"depends_on": ["nope"]}, "depends_on"),
        ({"depends_on": ["x"]}, "depends_on"),  # its own id
        ({"depends_on": "a"}, "depends_on"),
        ({"depends_on": [1]}, "depends_on"),
        ({"depends_on": [f"t{i}" for i in range(101)]}, "depends_on"),
        ({"depends_on": ["a"], "delay_millis": 10}, "depends_on"),
        ({"depends_on": ["a"], "on_dependency_failure": "ignore"}, "on_dependency_failure"),
    ],
)
def test_bad_dependencies_are_refused_storing_nothing(executor, options, field):
    executor.submit("contract.hook", None, task_id="a")
    with pytest.raises(InvalidDependencyError) as caught:
        executor.submit("contract.hook", None, task_id="x", **options)
    assert caught.value.field == field
    assert executor.get_task("x") is None


def test_a_batch_with_a_missing_dependency_stores_nothing(executor):
    requests = [
        TaskSubmitRequest("contract.hook", task_id="one"),
        TaskSubmitRequest("contract.hook", task_id="two", depends_on=["one"]),
        TaskSubmitRequest("contract.hook", task_id="three", depends_on=["missing"]),
    ]
    with pytest.raises(InvalidDependencyError, match="missing"):
        executor.submit_many(requests)
    with pytest.raises(InvalidDependencyError):
        executor.chain(requests)
    assert executor.storage.get_many(["one", "two", "three"]) == {}


def test_purge_forgets_finished_dependents_and_their_edges(executor, storage, clock):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b", depends_on=["a"])
    finish(executor, "a")
    finish(executor, "b")
    clock.advance(10)
    assert executor.purge_finished(clock.now()) == 2
    assert storage.dependents_of("a") == []


def test_inside_a_transaction_a_missing_dependency_is_refused_at_submit(executor, db_alias):
    from django.db import transaction

    with transaction.atomic(using=db_alias):
        executor.submit("contract.hook", None, task_id="a")
        with pytest.raises(InvalidDependencyError):
            executor.submit("contract.hook", None, task_id="b", depends_on=["nope"])
        executor.submit("contract.hook", None, task_id="c", depends_on=["a"])
    assert executor.get_task("b") is None
    assert executor.get_task("c").waiting_for == ("a",)


def test_both_dependencies_completed_in_one_batch_release_the_dependent_once(executor, storage):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b")
    executor.submit("contract.hook", None, task_id="c", depends_on=["a", "b"])
    executor.submit("contract.hook", None, task_id="d", depends_on=["a"])
    claims = storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    assert sorted(c.task_id for c in claims) == ["a", "b"]
    assert all(storage.complete_many([(claim, 1) for claim in claims]))
    assert executor.get_task("c").waiting_for == ()
    assert executor.get_task("d").waiting_for == ()
    assert claimable(storage) == ["c", "d"]
    assert executor.dependents_of("a") == ["c", "d"]


def test_waiting_dependents_hold_no_max_concurrency_slot(executor, storage):
    executor.submit("contract.hook", None, task_id="later", delay_millis=3_600_000)
    for i in range(3):
        executor.submit("contract.hook", None, task_id=f"w{i}", depends_on=["later"])
    executor.submit("contract.hook", None, task_id="x")
    claims = storage.claim("w1", ["default"], 10, LEASE, name_limits={"contract.hook": 1})
    assert [c.task_id for c in claims] == ["x"]


# -- a dependent stored while its dependency runs -----------------------------------------------
def test_a_dependent_stored_after_its_dependency_was_claimed_is_released_by_its_completion(
    executor, storage
):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b")
    # Claimed before anything depended on them: the claims know of no dependents.
    claims = storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    assert sorted(c.task_id for c in claims) == ["a", "b"]
    executor.submit("contract.hook", None, task_id="c", depends_on=["a"])
    # One batch: b completes alone, a must release c.
    assert all(storage.complete_many([(claim, 1) for claim in claims]))
    assert executor.get_task("a").status is TaskStatus.COMPLETED
    assert executor.get_task("b").status is TaskStatus.COMPLETED
    assert executor.get_task("c").waiting_for == ()
    assert claimable(storage) == ["c"]


@pytest.mark.parametrize("ending", ["complete", "fail"])
def test_a_dependent_stored_while_its_dependency_ends_is_settled(
    executor, storage, db_alias, ending
):
    """The submit of the dependent holds its transaction open while the ending of its
    dependency (claimed before: its claim knows of no dependent) runs in another thread;
    whichever goes first, the dependent ends up released (or cancelled, by a failure)."""
    executor.submit("contract.hook", None, task_id="a", retry_limit=0)
    claim = claim_and_start(storage)
    stored = threading.Event()
    ended = threading.Event()
    outcomes: list = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            with transaction.atomic(using=db_alias):
                executor.submit("contract.hook", None, task_id="c", depends_on=["a"])
                stored.set()
                # Gives the ending time to reach the locks this transaction holds
                # (it waits for them on the databases; Redis submits on commit).
                ended.wait(0.5)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            stored.set()
            connections.close_all()

    def end() -> None:
        try:
            stored.wait(10)
            if ending == "complete":
                outcomes.append(storage.complete(claim, 1))
            else:
                outcomes.append(storage.fail(claim, "boom", retryable=False))
        except BaseException as exc:
            errors.append(exc)
        finally:
            ended.set()
            connections.close_all()

    threads = [threading.Thread(target=submit), threading.Thread(target=end)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert outcomes[0] is not None
    if ending == "complete":
        assert executor.get_task("a").status is TaskStatus.COMPLETED
        assert executor.get_task("c").status is TaskStatus.CREATED
        assert executor.get_task("c").waiting_for == ()
        assert claimable(storage) == ["c"]
    else:
        assert executor.get_task("a").status is TaskStatus.FAILED
        assert executor.get_task("c").status is TaskStatus.CANCELLED


def test_only_the_completion_of_a_task_with_dependents_reads_the_edges(
    executor, storage, alias, db_alias
):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b")
    executor.submit("contract.hook", None, task_id="c", depends_on=["b"])
    claims = {
        c.task_id: c for c in storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    }
    assert sorted(claims) == ["a", "b"]
    with CaptureQueriesContext(connections[db_alias]) as queries:
        assert storage.complete(claims["a"], 1) is not None
    statements = [q["sql"] for q in queries.captured_queries]
    if alias == "redis":
        assert statements == []  # one script call
    else:
        # One UPDATE in autocommit: no transaction, no read of the dependency edges.
        assert len(statements) == 1, statements
        assert statements[0].startswith("UPDATE")
    with CaptureQueriesContext(connections[db_alias]) as queries:
        assert storage.complete(claims["b"], 1) is not None
    edges = [
        q["sql"] for q in queries.captured_queries if "reliable_executor_dependency" in q["sql"]
    ]
    assert len(edges) == (0 if alias == "redis" else 1)
    assert claimable(storage) == ["c"]


@pytest.mark.parametrize("is_error", [False, True])
def test_a_dependent_stored_after_its_dependency_was_claimed_is_cancelled_by_its_failure(
    executor, storage, is_error
):
    """The claim of ``a`` knows of no dependent: the failure's one-statement path must miss
    the row flagged since, and settle ``c`` on the full path."""
    executor.submit("contract.hook", None, task_id="a", retry_limit=0)
    claim = claim_and_start(storage)
    assert not claim.has_dependents
    executor.submit("contract.hook", None, task_id="c", depends_on=["a"])
    transition = storage.fail(claim, "boom", retryable=False, is_error=is_error)
    assert transition is not None
    expected = TaskStatus.ERROR if is_error else TaskStatus.FAILED
    assert executor.get_task("a").status is expected
    assert executor.get_task("c").status is TaskStatus.CANCELLED
    assert claimable(storage) == []


def test_the_failure_of_a_task_without_dependents_is_one_statement(
    executor, storage, alias, db_alias
):
    executor.submit("contract.hook", None, task_id="a", retry_limit=1)
    executor.submit("contract.hook", None, task_id="b", retry_limit=0)
    claims = {
        c.task_id: c for c in storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)
    }
    for task_id, status in (("b", TaskStatus.FAILED), ("a", TaskStatus.PENDING)):
        with CaptureQueriesContext(connections[db_alias]) as queries:
            transition = storage.fail(claims[task_id], "boom", retryable=True)
        assert transition is not None and transition.status is status
        task_rows = [
            q["sql"] for q in queries.captured_queries if "reliable_executor_task" in q["sql"]
        ]
        if alias == "redis":
            assert task_rows == []  # one script call
        else:
            # One UPDATE in autocommit (a retry also counts itself for the admin's chart).
            assert len(task_rows) == 1, task_rows
            assert task_rows[0].startswith("UPDATE")
            assert not any(
                "reliable_executor_dependency" in q["sql"] for q in queries.captured_queries
            )


@pytest.mark.parametrize("how", ["chain", "submit_many", "in_transaction", "submit_batch"])
def test_a_chain_whose_step_another_task_holds_stores_nothing(executor, storage, db_alias, how):
    """A step whose unique key another task holds is not stored (its holder is returned), so
    the step depending on it names a task the call does not store: refused, nothing stored."""
    executor.submit("contract.hook", None, task_id="holder", unique_for=60, unique_key="k")
    steps = [
        TaskSubmitRequest("contract.hook", task_id="s1"),
        TaskSubmitRequest("contract.hook", task_id="s2", unique_for=60, unique_key="k"),
        TaskSubmitRequest("contract.hook", task_id="s3"),
    ]
    if how != "chain":
        steps[2] = TaskSubmitRequest("contract.hook", task_id="s3", depends_on=["s2"])
    if how == "in_transaction":
        # Refused by the submit itself, not at commit (Redis writes then).
        with transaction.atomic(using=db_alias), pytest.raises(InvalidDependencyError) as caught:
            executor.submit_many(steps)
    elif how == "submit_batch":
        with pytest.raises(InvalidDependencyError) as caught:
            executor.submit_batch(steps, batch_id="refused")
        assert executor.get_batch("refused") is None  # not even opened
    else:
        with pytest.raises(InvalidDependencyError) as caught:
            (executor.chain if how == "chain" else executor.submit_many)(steps)
    assert caught.value.field == "depends_on"
    assert "'s3'" in str(caught.value) and "'s2'" in str(caught.value)
    assert storage.get_many(["s1", "s2", "s3"]) == {}
    assert [task.task_id for task in executor.list_tasks()] == ["holder"]
    assert claimable(storage) == ["holder"]


def test_a_limited_read_of_many_dependents_reads_only_that_many(executor, storage, alias):
    # 300 dependents: past the size Redis keeps a set compact in (128), where SSCAN reads
    # pages of about COUNT members; the databases read with a LIMIT.
    executor.submit("contract.hook", None, task_id="root")
    ids = [f"dep-{i:03d}" for i in range(300)]
    executor.submit_many(
        [TaskSubmitRequest("contract.hook", None, task_id=i, depends_on=["root"]) for i in ids]
    )
    assert executor.count_dependents("root") == 300 and executor.count_dependents("dep-1") == 0
    assert executor.dependents_of("root") == ids  # no limit: all of them, sorted
    if alias == "redis":
        client, replies = storage.client, []
        execute = client.execute_command

        def counted(*args, **kwargs):
            reply = execute(*args, **kwargs)
            replies.append((args[0], reply))
            return reply

        client.execute_command = counted
        try:
            first = executor.dependents_of("root", 20)
        finally:
            del client.execute_command
        # Sharded, the task's shard is found first (one read of the task itself).
        lookups = [name for name, _ in replies if name != "SSCAN"]
        assert lookups == (["HGETALL"] if storage.sharded else []), replies
        read = sum(len(reply[1]) for name, reply in replies if name == "SSCAN")
        assert read < 100, f"read {read} members for 20"
        assert first == sorted(first) and len(set(first)) == 20 and set(first) <= set(ids)
    else:
        with CaptureQueriesContext(connections[alias]) as queries:
            first = executor.dependents_of("root", 20)
        assert first == ids[:20]  # the first in id order
        (query,) = queries.captured_queries
        assert "LIMIT 20" in query["sql"].upper(), query["sql"]
    assert executor.dependents_of("root", 0) == []
    assert executor.dependents_of("root", 1000) == ids
