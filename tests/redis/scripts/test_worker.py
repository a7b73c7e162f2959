"""The Redis storage's worker-side Lua scripts (start, complete, fail, heartbeat, expire_claim,
release), each called for every race it can lose: a refused call changes nothing in Redis."""

from __future__ import annotations

import dataclasses

import pytest

from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.storage.redis.codec import micros
from tests.support.redis_support import (
    LEASE,
    NONCE,
    TERMINAL,
    WORKER_A,
    WORKER_B,
    assert_consistent,
    call,
    changed_keys,
    claim_one,
    fields_of,
    index_problems,
    later,
    lease_score,
    rerun_elsewhere,
    running,
    snapshot,
    submit,
    unchanged,
)


# -- the invariant checker itself -----------------------------------------------------------
def test_index_checker_reports_a_broken_index(storage, executor):
    """Guards the guard: a stray entry, a task in two indexes and a wrong count are caught."""
    submit(executor, "a")
    submit(executor, "b")
    assert_consistent(storage)
    storage.client.zadd(storage.p + "finished", {"a": 1})
    storage.client.hincrby(storage.p + "counts", "RUNNING:default", 1)
    storage.client.rpush(storage.p + "ready:default:0", "ghost")
    problems = index_problems(storage)
    assert any(line.startswith("a is CREATED but in") for line in problems)
    assert any("counts hash" in line for line in problems)
    assert any("unknown task ghost" in line for line in problems)


# -- claim, starting what idle threads will run ---------------------------------------------
def test_claim_starts_the_first_claims_it_is_asked_to(storage, executor, clock):
    for task_id in ("s1", "s2", "s3"):
        submit(executor, task_id)
    claims = storage.claim(WORKER_A, ["default"], 3, LEASE, start=2)
    assert [(c.task_id, c.is_started) for c in claims] == [
        ("s1", True),
        ("s2", True),
        ("s3", False),
    ]
    for claim in claims[:2]:
        info = executor.get_task(claim.task_id)
        assert (info.status, info.attempts, info.started_at) == (TaskStatus.RUNNING, 1, clock.now())
        assert (claim.task.attempts, claim.budget_attempts) == (1, 1)
        assert claim.task.started_at == clock.now()
        assert storage.start(claim, LEASE) is None  # started once, not twice
    assert executor.get_task("s3").status is TaskStatus.CREATED
    assert_consistent(storage)
    # A started claim is completed like one start started; only the unstarted one goes back.
    assert storage.complete_many([(claims[0], "done")])[0] is not None
    assert storage.release(claims[1:]) == 1
    assert executor.get_task("s2").status is TaskStatus.RUNNING
    assert_consistent(storage)


def test_claim_does_not_start_a_task_past_its_deadline(storage, executor, clock):
    submit(executor, "late", max_duration_millis=1000)
    submit(executor, "fresh")
    clock.advance(2)
    claims = storage.claim(WORKER_A, ["default"], 2, LEASE, start=2)
    assert [(c.task_id, c.is_started) for c in claims] == [("late", False), ("fresh", True)]
    assert executor.get_task("late").attempts == 0
    assert_consistent(storage)


def test_a_task_submitted_after_the_claims_clock_reading_starts_no_earlier_than_created(
    storage, executor, clock
):
    """The claim's now is read before it is sent: a task submitted meanwhile (by a submitter
    whose clock reads later) is recorded as started when it was created, never before."""
    submit(executor, "t1")
    created = executor.get_task("t1").created_at
    clock.advance(-1)  # the claiming worker read its clock a second earlier
    [claim] = storage.claim(WORKER_A, ["default"], 1, LEASE, start=1)
    assert claim.task.started_at == created == executor.get_task("t1").started_at


# -- start ----------------------------------------------------------------------------------
def test_start_refuses_a_token_bumped_by_release(storage, executor):
    submit(executor, "t1")
    claim = claim_one(storage)
    assert storage.release([claim]) == 1
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
    again = claim_one(storage, WORKER_B)
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
    assert storage.start(again, LEASE) is not None
    assert_consistent(storage)


def test_start_refuses_a_token_bumped_by_recovery(storage, executor, clock):
    submit(executor, "t1")
    claim = claim_one(storage)
    clock.advance(LEASE + 1)
    assert storage.recover_expired(100) == []  # an unstarted claim goes back without a word
    assert int(fields_of(storage, "t1")["k"]) == claim.token + 1
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
    again = claim_one(storage, WORKER_B)
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
    assert storage.start(again, LEASE) is not None
    assert_consistent(storage)


def test_old_claim_of_a_recovered_attempt_is_refused(storage, executor, clock):
    """Recovery re-queues a RUNNING task without a new token: PENDING, the same token, w still
    worker-a. Only the missing lease stops worker-a's old claim from starting it again."""
    claim = running(storage, executor, "t1")
    clock.advance(LEASE + 1)
    storage.recover_expired(100)
    values = fields_of(storage, "t1")
    assert (values["s"], values["k"]) == ("PENDING", str(claim.token))
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
        assert storage.release([claim]) == 0
        assert storage.expire_claim(claim) is None
        assert storage.heartbeat(WORKER_A, {"t1": claim.token}, LEASE) == {}
    assert_consistent(storage)


def test_start_refuses_a_task_cancelled_meanwhile(storage, executor):
    submit(executor, "t1")
    claim = claim_one(storage)
    assert storage.cancel("t1").changed
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
    assert fields_of(storage, "t1")["s"] == "CANCELLED"
    assert_consistent(storage)


def test_start_refuses_a_task_already_running(storage, executor, clock):
    submit(executor, "t1")
    claim = claim_one(storage)
    started = storage.start(claim, LEASE)
    assert started is not None
    clock.advance(5)  # a second start would move st and the lease, and count another attempt
    with unchanged(storage):
        assert storage.start(claim, LEASE) is None
        assert storage.start(started, LEASE) is None
    assert fields_of(storage, "t1")["a"] == "1"
    assert_consistent(storage)


def test_start_refuses_a_task_nobody_claimed(storage, executor):
    submit(executor, "t1")
    token = fields_of(storage, "t1")["k"]  # the token matches: only the lease is missing
    with unchanged(storage):
        assert call(storage, "start", later(storage.clock, LEASE), NONCE, "t1", token) == [0]
    assert_consistent(storage)


def test_start_refuses_an_unknown_id(storage, executor):
    submit(executor, "t1")
    with unchanged(storage):
        assert call(storage, "start", later(storage.clock, LEASE), NONCE, "nope", "1") == [0]


def test_start_batch_starts_only_the_valid_claims(storage, executor):
    for task_id in ("a", "b", "c"):
        submit(executor, task_id)
    a, b, c = storage.claim(WORKER_A, ["default"], 3, LEASE)
    assert storage.release([b]) == 1
    storage.clock.advance(1)  # the started leases move
    before = snapshot(storage)
    assert [s is not None for s in storage.start_many([a, b, c], LEASE)] == [True, False, True]
    assert changed_keys(before, snapshot(storage)) == {"t:a", "t:c", "leases", "counts"}
    assert_consistent(storage)


# -- complete -------------------------------------------------------------------------------
def test_complete_refuses_a_stale_token(storage, executor, clock):
    lost = running(storage, executor, "t1")
    rerun_elsewhere(storage, clock, lost)
    with unchanged(storage):
        assert storage.complete(lost, "late") is None
    assert fields_of(storage, "t1")["s"] == "RUNNING"
    assert_consistent(storage)


def test_complete_refuses_a_task_timed_out_by_the_deadline(storage, executor, clock):
    claim = running(storage, executor, "t1", max_duration_millis=10_000)
    clock.advance(11)
    [timed_out] = storage.expire_overdue(100)
    assert timed_out.status is TaskStatus.TIMEOUT
    with unchanged(storage):
        assert storage.complete(claim, "late") is None
    assert_consistent(storage)


def test_complete_refuses_a_task_cancelled_then_failed(storage, executor):
    claim = running(storage, executor, "t1")
    assert storage.cancel("t1").requested_only
    transition = storage.fail(claim, "stopped", retryable=True)
    assert transition is not None and transition.status is TaskStatus.CANCELLED
    with unchanged(storage):
        assert storage.complete(claim, "late") is None
    assert_consistent(storage)


def test_complete_refuses_an_unknown_id(storage, executor):
    submit(executor, "t1")
    with unchanged(storage):
        assert call(storage, "complete", NONCE, "nope", "1", '"x"') == [0]


def test_complete_batch_changes_only_the_valid_task(storage, executor):
    for task_id in ("a", "b", "d"):
        submit(executor, task_id)
    a = storage.start(claim_one(storage), LEASE)
    b = storage.start(claim_one(storage), LEASE)
    d = claim_one(storage)  # claimed, never started
    assert a is not None and b is not None
    stale_b = dataclasses.replace(b, token=b.token - 1)
    ghost = dataclasses.replace(a, task=dataclasses.replace(a.task, task_id="ghost"))
    before = snapshot(storage)
    results = storage.complete_many([(a, 1), (stale_b, 2), (d, 3), (ghost, 4)])
    assert [r is not None for r in results] == [True, False, False, False]
    after = snapshot(storage)
    assert changed_keys(before, after) == {
        "t:a",
        "leases",
        "held",  # the held count of demo.echo (max_concurrency) follows the leases
        "finished",
        "done:COMPLETED",
        "counts",
        # the admin chart's count of the minute: one completion
        f"tput:{int(storage.clock.now().timestamp()) // 60}",
    }
    tput = f"tput:{int(storage.clock.now().timestamp()) // 60}"
    assert after[tput][1] == {"COMPLETED": "1", "c:default": "1"}  # and per queue
    assert after["leases"][1] == [(i, s) for i, s in before["leases"][1] if i != "a"]
    assert_consistent(storage)


# -- fail -----------------------------------------------------------------------------------
def test_fail_refuses_a_stale_token(storage, executor, clock):
    lost = running(storage, executor, "t1")
    rerun_elsewhere(storage, clock, lost)
    with unchanged(storage):
        assert storage.fail(lost, "late", retryable=True) is None
        assert storage.fail(lost, "late", retryable=False, is_error=True) is None
    assert_consistent(storage)


@pytest.mark.parametrize("state", ["claimed", "completed", "timed_out", "requeued"])
def test_fail_refuses_a_task_not_running(storage, executor, clock, state):
    submit(executor, "t1", max_duration_millis=100_000)
    claim = claim_one(storage)
    if state != "claimed":
        claim = storage.start(claim, LEASE)
    if state == "completed":
        assert storage.complete(claim, "ok") is not None
    elif state == "timed_out":
        clock.advance(101)
        assert storage.expire_overdue(100)
    elif state == "requeued":  # the lease ran out: the attempt already counted as failed
        clock.advance(LEASE + 1)
        assert storage.recover_expired(100)
    with unchanged(storage):
        for outcome, is_error in (("PENDING", "0"), ("FAILED", "0"), ("FAILED", "1")):
            run_at = micros(clock.now())
            args = ["t1", str(claim.token), "late", outcome, run_at, is_error, NONCE]
            assert call(storage, "fail", *args) is None
        if state != "claimed":  # an unstarted claim has no attempt to fail (the worker knows)
            assert storage.fail(claim, "late", retryable=True) is None
            assert storage.fail(claim, "late", retryable=False, is_error=True) is None
    assert_consistent(storage)


@pytest.mark.parametrize(
    ("outcome", "is_error", "expected"),
    [
        ("PENDING", "0", "CANCELLED"),
        ("FAILED", "0", "CANCELLED"),
        ("TIMEOUT", "0", "CANCELLED"),
        ("PENDING", "1", "ERROR"),
        ("FAILED", "1", "ERROR"),
    ],
)
def test_fail_after_a_cancel_request(storage, executor, clock, outcome, is_error, expected):
    """A requested cancel turns the caller's outcome into CANCELLED; ERROR wins over it."""
    claim = running(storage, executor, "t1")
    assert storage.cancel("t1").requested_only
    run_at = later(clock, 60) if outcome == "PENDING" else ""
    args = ["t1", str(claim.token), "boom", outcome, run_at, is_error, NONCE]
    reply = call(storage, "fail", *args)
    assert reply == [expected, "1"]
    values = fields_of(storage, "t1")
    assert (values["s"], values["e"], values["f"]) == (expected, "boom", micros(clock.now()))
    assert storage.client.zscore(storage.p + "finished", "t1") is not None
    assert storage.client.zcard(storage.p + "sched:default") == 0
    assert storage.count()[TaskStatus(expected)] == 1
    assert_consistent(storage)


@pytest.mark.parametrize(
    ("retry_limit", "is_error", "expected"),
    [
        (3, False, TaskStatus.CANCELLED),
        (0, False, TaskStatus.CANCELLED),
        (3, True, TaskStatus.ERROR),
    ],
)
def test_fail_through_the_storage_after_a_cancel_request(
    storage, executor, retry_limit, is_error, expected
):
    """The Python side computes PENDING (or FAILED) without the flag; the script decides."""
    claim = running(storage, executor, "t1", retry_limit=retry_limit)
    storage.cancel("t1")
    transition = storage.fail(claim, "boom", retryable=True, is_error=is_error)
    assert transition is not None and transition.status == expected
    assert storage.get("t1").status == expected
    assert_consistent(storage)


# -- a worker write sent again after a lost reply (the per-call nonce) ---------------------
def test_start_sent_again_answers_the_same_and_changes_nothing(storage, executor, clock):
    submit(executor, "t1")
    claim = claim_one(storage)
    args = [later(clock, LEASE), "n1", "t1", str(claim.token)]
    assert call(storage, "start", *args) == [1]
    clock.advance(5)
    with unchanged(storage):
        assert call(storage, "start", *args) == [1]  # redis-py's resend: done already
        assert call(storage, "start", later(clock, LEASE), "n2", "t1", str(claim.token)) == [0]
    assert fields_of(storage, "t1")["a"] == "1"
    assert_consistent(storage)


def test_complete_sent_again_answers_the_same_and_changes_nothing(storage, executor, clock):
    claim = running(storage, executor, "t1")
    args = ["n1", "t1", str(claim.token), '"ok"']
    assert call(storage, "complete", *args) == [1]
    clock.advance(5)
    with unchanged(storage):
        assert call(storage, "complete", *args) == [1]
        assert call(storage, "complete", "n2", "t1", str(claim.token), '"other"') == [0]
    assert_consistent(storage)


@pytest.mark.parametrize("outcome", ["PENDING", "FAILED"])
def test_fail_sent_again_answers_the_same_and_changes_nothing(storage, executor, clock, outcome):
    claim = running(storage, executor, "t1")
    args = ["t1", str(claim.token), "boom", outcome, later(clock, 60), "0", "n1"]
    first = call(storage, "fail", *args)
    assert first == [outcome, "0"]
    clock.advance(5)
    with unchanged(storage):
        assert call(storage, "fail", *args) == first
        assert call(storage, "fail", *args[:-1], "n2") is None
    assert_consistent(storage)


def test_a_resent_write_of_a_stale_claim_is_still_refused(storage, executor, clock):
    """The token decides, not the nonce: worker A's writes, resent after its task was re-run
    by worker B, change nothing."""
    submit(executor, "t1")
    claim = claim_one(storage)
    start = [later(clock, LEASE), "a-start", "t1", str(claim.token)]
    assert call(storage, "start", *start) == [1]
    rerun_elsewhere(storage, clock, claim)
    with unchanged(storage):
        assert call(storage, "start", *start) == [0]
        assert call(storage, "complete", "a-start", "t1", str(claim.token), '"late"') == [0]
        fail = ["t1", str(claim.token), "late", "FAILED", "", "0", "a-start"]
        assert call(storage, "fail", *fail) is None
    assert_consistent(storage)


# -- heartbeat ------------------------------------------------------------------------------
def test_heartbeat_ignores_another_workers_task(storage, executor):
    claim = running(storage, executor, "t1")
    storage.clock.advance(5)
    with unchanged(storage):
        assert storage.heartbeat(WORKER_B, {"t1": claim.token}, LEASE) == {}


@pytest.mark.parametrize("started", [False, True])
def test_heartbeat_ignores_a_lease_recovered_meanwhile(storage, executor, clock, started):
    submit(executor, "t1")
    claim = claim_one(storage)
    if started:
        storage.start(claim, LEASE)
    clock.advance(LEASE + 1)
    storage.recover_expired(100)
    # A recovered RUNNING task keeps w = worker-a; only the missing lease tells it apart.
    with unchanged(storage):
        assert storage.heartbeat(WORKER_A, {"t1": claim.token}, LEASE) == {}
    assert_consistent(storage)


@pytest.mark.parametrize("end", ["completed", "failed", "cancelled_claim", "timed_out"])
def test_heartbeat_ignores_terminal_tasks(storage, executor, clock, end):
    submit(executor, "t1", retry_limit=0, max_duration_millis=100_000)
    claim = claim_one(storage)
    if end == "cancelled_claim":  # cancelled before start: w still names worker-a
        storage.cancel("t1")
    elif end == "timed_out":
        clock.advance(101)
        storage.expire_overdue(100)
    else:
        claim = storage.start(claim, LEASE)
        if end == "completed":
            storage.complete(claim, "ok")
        else:
            storage.fail(claim, "boom", retryable=False)
    assert fields_of(storage, "t1")["s"] in TERMINAL
    with unchanged(storage):
        assert storage.heartbeat(WORKER_A, {"t1": claim.token}, LEASE) == {}
    if end == "timed_out":
        return  # a leased TIMEOUT task is one whose handler runs on: see the expire tests
    # Even a stray lease entry is not renewed for a finished task.
    storage.client.zadd(storage.p + "leases", {"t1": 12345})
    with unchanged(storage):
        assert storage.heartbeat(WORKER_A, {"t1": claim.token}, LEASE) == {}
    storage.client.zrem(storage.p + "leases", "t1")
    assert_consistent(storage)


def test_heartbeat_renews_only_the_workers_own_leases(storage, executor, clock):
    for task_id in ("mine_running", "mine_claimed", "theirs"):
        submit(executor, task_id)
    mine = storage.start(claim_one(storage), LEASE)
    claimed = claim_one(storage)
    claim_one(storage, WORKER_B)
    storage.cancel("mine_running")
    clock.advance(10)
    theirs = lease_score(storage, "theirs")
    tokens = {"mine_running": mine.token, "mine_claimed": claimed.token, "theirs": 1, "nope": 1}
    held = storage.heartbeat(WORKER_A, tokens, LEASE)
    assert held == {"mine_running": (mine.token, True), "mine_claimed": (claimed.token, False)}
    renewed = int(later(clock, LEASE))
    assert lease_score(storage, "mine_running") == lease_score(storage, "mine_claimed") == renewed
    assert lease_score(storage, "theirs") == theirs
    assert_consistent(storage)


# -- expire_claim ---------------------------------------------------------------------------
def test_expire_claim_refuses_a_started_task(storage, executor):
    claim = running(storage, executor, "t1", max_duration_millis=1000)
    with unchanged(storage):
        assert storage.expire_claim(claim) is None


def test_expire_claim_refuses_a_stale_token(storage, executor):
    submit(executor, "t1", max_duration_millis=1000)
    claim = claim_one(storage)
    storage.release([claim])
    again = claim_one(storage, WORKER_B)
    with unchanged(storage):
        assert storage.expire_claim(claim) is None
    transition = storage.expire_claim(again)
    assert transition is not None and transition.previous is TaskStatus.CREATED
    assert_consistent(storage)


def test_expire_claim_refuses_a_released_claim(storage, executor):
    """The token bumped by release is what refuses it; the unclaimed task keeps its place."""
    submit(executor, "t1")
    claim = claim_one(storage)
    storage.release([claim])
    current = dataclasses.replace(claim, token=claim.token + 1)  # right token, but no lease
    with unchanged(storage):
        assert storage.expire_claim(claim) is None
        assert storage.expire_claim(current) is None


# -- release --------------------------------------------------------------------------------
def test_release_refuses_a_stale_token(storage, executor):
    submit(executor, "t1")
    claim = claim_one(storage)
    storage.release([claim])
    claim_one(storage, WORKER_B)
    with unchanged(storage):
        assert storage.release([claim]) == 0


def test_release_refuses_a_running_task(storage, executor):
    started = running(storage, executor, "t1")
    with unchanged(storage):
        assert storage.release([started]) == 0


def test_release_twice_is_a_no_op(storage, executor):
    for task_id in ("a", "b"):
        submit(executor, task_id)
    claims = storage.claim(WORKER_A, ["default"], 2, LEASE)
    assert storage.release(claims) == 2
    assert storage.client.lrange(storage.p + "ready:default:0", 0, -1) == ["a", "b"]
    with unchanged(storage):
        assert storage.release(claims) == 0
    assert_consistent(storage)
