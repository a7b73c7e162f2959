"""Durable waits (context.sleep, wait_for_event, wait_for; executor.send_event): the handler
stops, its task waits PENDING without a lease (TaskInfo.waiting set, no attempt counted, a
resumption counted), is claimable only once its time comes, its event arrives or its tasks
have ended, and its handler is then called again from the top, the wait returning at once."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from django_reliable_executor import EventTimeout, TaskStatus, WaitTimeout, signals
from tests.support.contract_support import HOOKS, LEASE, claim_one, recording, run_claim


def due(storage, queue="default"):
    """The ids a claim takes now (handed back at once: only looking)."""
    claims = storage.claim("peek", [queue], 10, LEASE)
    storage.release(claims)
    return [c.task_id for c in claims]


def run_one(executor):
    return run_claim(executor, claim_one(executor.storage))


# -- sleep ----------------------------------------------------------------------------------
def test_a_sleep_frees_the_worker_and_resumes_once_its_time_has_passed(executor, clock):
    executor.submit("contract.hook", None, task_id="s")
    seen: list = []

    def handler(context):
        seen.append(("top", context.attempt, context.resumptions))
        context.step("before", lambda: seen.append("before") or 1)
        context.sleep("nap", dt.timedelta(hours=3))
        seen.append("after")
        return "done"

    HOOKS["s"] = handler
    with recording(signals.task_waiting) as waited:
        assert run_one(executor) is TaskStatus.PENDING
    info = executor.get_task("s")
    assert info.status is TaskStatus.PENDING
    assert info.attempts == 0 and info.resumptions == 1
    until = clock.now() + dt.timedelta(hours=3)
    assert info.waiting == {
        "kind": "sleep",
        "name": "nap",
        "until": until.isoformat(),
        "event": None,
        "task_ids": [],
    }
    assert info.run_at == until
    assert not info.handler_running
    assert [c["kind"] for c in waited.calls] == ["sleep"]
    assert [s.name for s in info.steps] == ["before", "nap"]
    clock.advance(3 * 3600 - 1)
    assert due(executor.storage) == []
    clock.advance(1)
    assert run_one(executor) is TaskStatus.COMPLETED
    info = executor.get_task("s")
    assert info.result == "done" and info.attempts == 1 and info.resumptions == 1
    assert info.waiting is None
    # The step ran once; the handler ran from the top twice, the second time as attempt 1
    # again (a resumption is not an attempt).
    assert seen == [("top", 1, 0), "before", ("top", 1, 1), "after"]


def test_a_sleep_s_end_is_fixed_by_its_first_call(executor, clock):
    executor.submit("contract.hook", None, task_id="fixed")
    calls: list = []

    def handler(context):
        calls.append(context.resumptions)
        if calls == [0, 1]:
            raise ConnectionError("resumed, then failed: retried")
        context.sleep("nap", 100)
        return "ok"

    HOOKS["fixed"] = handler
    assert run_one(executor) is TaskStatus.PENDING
    clock.advance(100)
    assert run_one(executor) is TaskStatus.PENDING  # the failure's retry
    clock.advance(5)
    # Retried after the sleep's end: the same sleep returns at once (not 100 s more).
    assert run_one(executor) is TaskStatus.COMPLETED
    assert calls == [0, 1, 1]


def test_a_zero_sleep_returns_at_once(executor):
    executor.submit("contract.hook", None, task_id="zero")
    HOOKS["zero"] = lambda context: context.sleep("nap", 0) or "ok"
    assert run_one(executor) is TaskStatus.COMPLETED
    assert executor.get_task("zero").resumptions == 0


# -- events ---------------------------------------------------------------------------------
def test_an_event_resumes_its_waiting_task_and_is_returned(executor, clock):
    executor.submit("contract.hook", None, task_id="e")
    HOOKS["e"] = lambda context: {"got": context.wait_for_event("approved")}
    assert run_one(executor) is TaskStatus.PENDING
    info = executor.get_task("e")
    assert info.waiting["kind"] == "event" and info.waiting["event"] == "approved"
    assert info.waiting["until"] is None
    clock.advance(10 * 365 * 86400)  # no timeout: never due by time
    assert due(executor.storage) == []
    assert executor.send_event("e", "other", 1) is True  # not what it waits for
    assert due(executor.storage) == []
    assert executor.send_event("e", "approved", {"by": "ann"}) is True
    assert executor.send_event("e", "approved", {"by": "bob"}) is True  # kept: the first
    assert run_one(executor) is TaskStatus.COMPLETED
    assert executor.get_task("e").result == {"got": {"by": "ann"}}
    assert executor.storage.task_events("e") == {"other": 1, "approved": {"by": "ann"}}


def test_an_event_sent_before_the_wait_returns_at_once(executor):
    executor.submit("contract.hook", None, task_id="early")
    assert executor.send_event("early", "go", [1, 2]) is True
    HOOKS["early"] = lambda context: context.wait_for_event("go")
    assert run_one(executor) is TaskStatus.COMPLETED
    info = executor.get_task("early")
    assert info.result == [1, 2] and info.resumptions == 0


def test_an_event_sent_while_the_handler_runs_makes_its_wait_due_at_once(executor):
    executor.submit("contract.hook", None, task_id="race")

    def handler(context):
        if context.resumptions == 0:
            # Sent after the handler read the events, before it is handed back: the
            # suspend finds it and makes the task due now.
            original = context._executor.storage.task_events

            def read_then_send(task_id):
                found = original(task_id)
                assert context._executor.send_event(task_id, "go", "late") is True
                return found

            context._executor.storage.task_events = read_then_send
            try:
                return context.wait_for_event("go")
            finally:
                del context._executor.storage.task_events
        return context.wait_for_event("go")

    HOOKS["race"] = handler
    assert run_one(executor) is TaskStatus.PENDING
    assert due(executor.storage) == ["race"]
    assert run_one(executor) is TaskStatus.COMPLETED
    assert executor.get_task("race").result == "late"


def test_an_event_timeout_raises_event_timeout_in_the_handler(executor, clock):
    executor.submit("contract.hook", None, task_id="t", retry_limit=0)
    caught: list = []

    def handler(context):
        try:
            return context.wait_for_event("reply", timeout=dt.timedelta(minutes=5))
        except EventTimeout as exc:
            caught.append(str(exc))
            return "gave up"

    HOOKS["t"] = handler
    assert run_one(executor) is TaskStatus.PENDING
    assert executor.get_task("t").run_at == clock.now() + dt.timedelta(minutes=5)
    clock.advance(300)
    assert run_one(executor) is TaskStatus.COMPLETED
    assert executor.get_task("t").result == "gave up"
    assert caught and "timed out" in caught[0]


def test_send_event_to_a_terminal_or_unknown_task_stores_nothing(executor):
    executor.submit("contract.hook", None, task_id="over")
    HOOKS["over"] = lambda context: 1
    assert run_one(executor) is TaskStatus.COMPLETED
    assert executor.send_event("over", "go") is False
    assert executor.storage.task_events("over") == {}
    assert executor.send_event("nobody", "go") is False


@pytest.mark.parametrize(
    "name, payload, message",
    [
        ("", None, "event name must be a non-empty string"),
        ("x" * 300, None, "at most"),
        ("go", object(), "payload is not JSON-serialisable"),
        ("go", "a\x00b", "payload is not JSON-serialisable"),
    ],
)
def test_send_event_refuses_bad_input_by_name(executor, name, payload, message):
    executor.submit("contract.hook", None, task_id="bad")
    with pytest.raises((TypeError, ValueError), match=message):
        executor.send_event("bad", name, payload)
    assert executor.storage.task_events("bad") == {}


# -- wait_for -------------------------------------------------------------------------------
def test_wait_for_resumes_once_every_task_has_ended_and_returns_them(executor, clock):
    executor.submit("contract.hook", None, task_id="a")
    executor.submit("contract.hook", None, task_id="b", retry_limit=0)
    executor.submit("contract.hook", None, task_id="w")
    HOOKS["a"] = lambda context: "A"

    def fail(context):
        raise ValueError("b fails")

    HOOKS["b"] = fail

    def waiter(context):
        ended = context.wait_for("children", ["a", "b"])
        return {k: v.status.value for k, v in ended.items()}

    HOOKS["w"] = waiter
    claims = executor.storage.claim("w1", ["default"], 10, LEASE)
    by_id = {c.task_id: c for c in claims}
    assert run_claim(executor, by_id["w"]) is TaskStatus.PENDING
    info = executor.get_task("w")
    assert info.waiting["kind"] == "tasks" and sorted(info.waiting["task_ids"]) == ["a", "b"]
    assert sorted(info.waiting_for) == ["a", "b"]
    assert run_claim(executor, by_id["a"]) is TaskStatus.COMPLETED
    assert due(executor.storage) == []  # b has not ended
    assert run_claim(executor, by_id["b"]) is TaskStatus.FAILED  # any ending counts
    assert run_one(executor) is TaskStatus.COMPLETED
    assert executor.get_task("w").result == {"a": "COMPLETED", "b": "FAILED"}


def test_wait_for_tasks_already_ended_returns_at_once(executor):
    executor.submit("contract.hook", None, task_id="done")
    HOOKS["done"] = lambda context: 1
    assert run_one(executor) is TaskStatus.COMPLETED
    executor.submit("contract.hook", None, task_id="w2")
    HOOKS["w2"] = lambda context: context.wait_for("x", ["done"])["done"].result
    assert run_one(executor) is TaskStatus.COMPLETED
    assert executor.get_task("w2").result == 1


def test_wait_for_an_unknown_task_fails_the_attempt_naming_it(executor):
    executor.submit("contract.hook", None, task_id="w3", retry_limit=0)
    HOOKS["w3"] = lambda context: context.wait_for("x", ["ghost"])
    assert run_one(executor) is TaskStatus.FAILED
    assert "no task 'ghost'" in executor.get_task("w3").last_error


def test_wait_for_with_a_timeout_raises_wait_timeout(executor, clock):
    executor.submit("contract.hook", None, task_id="slow")
    executor.submit("contract.hook", None, task_id="w4", retry_limit=0)

    def waiter(context):
        try:
            context.wait_for("x", ["slow"], timeout=60)
        except WaitTimeout as exc:
            return str(exc)

    HOOKS["w4"] = waiter
    claims = {c.task_id: c for c in executor.storage.claim("w1", ["default"], 10, LEASE)}
    executor.storage.release([claims["slow"]])
    assert run_claim(executor, claims["w4"]) is TaskStatus.PENDING
    clock.advance(60)
    HOOKS["slow"] = lambda context: 1
    ids = {c.task_id: c for c in executor.storage.claim("w1", ["default"], 10, LEASE)}
    executor.storage.release([ids["slow"]])
    assert run_claim(executor, ids["w4"]) is TaskStatus.COMPLETED
    assert "tasks not ended in time: slow" in executor.get_task("w4").result


# -- with the other features -----------------------------------------------------------------
def test_cancel_of_a_waiting_task_ends_it_cancelled_at_once(executor):
    executor.submit("contract.hook", None, task_id="c")
    HOOKS["c"] = lambda context: context.wait_for_event("never")
    assert run_one(executor) is TaskStatus.PENDING
    assert executor.cancel_task("c") is True
    info = executor.get_task("c")
    assert info.status is TaskStatus.CANCELLED and info.waiting is None
    assert executor.send_event("c", "never") is False


def test_a_cancel_requested_while_it_runs_wins_over_its_wait(executor):
    executor.submit("contract.hook", None, task_id="cr")

    def handler(context):
        context._executor.cancel_task("cr")  # requested while it runs
        context.sleep("nap", 60)

    HOOKS["cr"] = handler
    assert run_one(executor) is TaskStatus.CANCELLED
    assert executor.get_task("cr").status is TaskStatus.CANCELLED


def test_a_stale_attempt_cannot_suspend(executor, clock):
    executor.submit("contract.hook", None, task_id="stale")
    claim = executor.storage.start(claim_one(executor.storage), LEASE)
    clock.advance(LEASE + 1)
    executor.storage.recover_expired(100)
    from django_reliable_executor.core.waits import SLEEP, Wait

    wait = Wait(SLEEP, "nap", until=clock.now() + dt.timedelta(seconds=9))
    assert executor.storage.suspend(claim, wait) is None
    info = executor.get_task("stale")
    assert info.waiting is None and info.resumptions == 0 and info.steps == ()


def test_a_retry_after_a_wait_clears_waiting(executor, clock):
    executor.submit("contract.hook", None, task_id="r", retry_limit=1)

    def handler(context):
        context.sleep("nap", 10)
        raise ConnectionError("fails after the sleep")

    HOOKS["r"] = handler
    assert run_one(executor) is TaskStatus.PENDING
    clock.advance(10)
    assert run_one(executor) is TaskStatus.PENDING  # a retry now, not a wait
    info = executor.get_task("r")
    assert info.waiting is None and info.attempts == 1 and info.resumptions == 1


def test_purge_deletes_the_events_of_a_task(executor, clock):
    executor.submit("contract.hook", None, task_id="p")
    executor.send_event("p", "go", 1)
    HOOKS["p"] = lambda context: context.wait_for_event("go")
    assert run_one(executor) is TaskStatus.COMPLETED
    clock.advance(86400 * 30)
    executor.purge_finished(clock.now() - dt.timedelta(days=1))
    assert executor.get_task("p") is None
    assert executor.storage.task_events("p") == {}


def test_count_waiting_counts_each_kind_until_the_task_leaves_its_wait(executor, clock):
    assert executor.count_waiting() == {"sleep": 0, "event": 0, "tasks": 0}
    for task_id in ("n1", "n2", "ev", "cancelled"):
        executor.submit("contract.hook", None, task_id=task_id)
    HOOKS["n1"] = HOOKS["n2"] = lambda context: context.sleep("nap", 10)
    HOOKS["ev"] = HOOKS["cancelled"] = lambda context: context.wait_for_event("go")
    claims = executor.storage.claim("w1", ["default"], 10, LEASE)
    for claim in claims:
        assert run_claim(executor, claim) is TaskStatus.PENDING
    assert executor.count_waiting() == {"sleep": 2, "event": 2, "tasks": 0}
    assert executor.cancel_task("cancelled")
    clock.advance(10)
    HOOKS["n1"] = HOOKS["n2"] = lambda context: "woke"
    claims = executor.storage.claim("w1", ["default"], 10, LEASE)  # the sleepers, resumed
    assert sorted(c.task_id for c in claims) == ["n1", "n2"]
    assert executor.count_waiting() == {"sleep": 0, "event": 1, "tasks": 0}
    executor.storage.release(claims)


def test_a_deadline_passed_while_waiting_ends_the_task_timeout(executor, clock):
    executor.submit("contract.hook", None, task_id="late", max_duration_millis=60_000)
    HOOKS["late"] = lambda context: context.wait_for_event("never")
    assert run_one(executor) is TaskStatus.PENDING
    clock.advance(61)
    transitions = executor.storage.expire_overdue(100)
    assert [(t.task.task_id, t.status) for t in transitions] == [("late", TaskStatus.TIMEOUT)]
    assert executor.get_task("late").status is TaskStatus.TIMEOUT
    assert executor.count_waiting()["event"] == 0
    assert executor.send_event("late", "never") is False


def test_a_waiting_task_holds_no_max_concurrency_slot(executor, clock):
    # demo.capped_waits allows one at a time: both wait for an event, one after the other.
    limits = {"demo.capped_waits": 1}

    def run_capped():
        claims = executor.storage.claim("w1", ["default"], 10, LEASE, name_limits=limits)
        assert len(claims) == 1, [c.task_id for c in claims]  # one slot: one at a time
        return run_claim(executor, claims[0])

    for task_id in ("cap-1", "cap-2"):
        executor.submit("demo.capped_waits", {"wait": "event"}, task_id=task_id)
    assert run_capped() is TaskStatus.PENDING
    assert run_capped() is TaskStatus.PENDING  # the first's wait freed the slot
    assert {executor.get_task(t).waiting["kind"] for t in ("cap-1", "cap-2")} == {"event"}
    for task_id in ("cap-1", "cap-2"):
        assert executor.send_event(task_id, "go", task_id)
    assert run_capped() is TaskStatus.COMPLETED
    assert run_capped() is TaskStatus.COMPLETED


# -- found by a red-team read ------------------------------------------------------------
LIMITS = {"demo.capped_waits": 1}


def test_resumed_wait_for_after_its_timeout_still_holds_its_max_concurrency_slot(executor, clock):
    """A wait_for that timed out resumes with waiting_for still set: while it runs it must
    hold its max_concurrency slot like any running task."""
    executor.submit("contract.hook", None, task_id="slow", queue="elsewhere")  # never ends
    executor.submit(
        "demo.capped_waits",
        {"wait": "tasks", "task_ids": ["slow"], "timeout": 60},
        task_id="cap-1",
    )
    claims = executor.storage.claim("w1", ["default"], 10, LEASE, name_limits=LIMITS)
    assert [c.task_id for c in claims] == ["cap-1"]
    assert run_claim(executor, claims[0]) is TaskStatus.PENDING  # waits for "slow"
    clock.advance(61)
    # The timeout passed: cap-1 is claimed (resumed) and started; it runs (holds the slot).
    claims = executor.storage.claim("w1", ["default"], 10, LEASE, name_limits=LIMITS)
    assert [c.task_id for c in claims] == ["cap-1"]
    assert executor.storage.start(claims[0], LEASE) is not None
    executor.submit("demo.capped_waits", {"wait": "event"}, task_id="cap-2")
    second = executor.storage.claim("w1", ["default"], 10, LEASE, name_limits=LIMITS)
    assert [c.task_id for c in second] == [], "max_concurrency=1 let a second one run"


def test_attempt_timeout_passed_before_a_wait_is_not_swallowed(executor, clock):
    """A thread handler that ran past its attempt_timeout, then reached a wait: the attempt
    timed out (docs: attempt_timeout limits each run of the handler)."""
    executor.submit("contract.hook", None, task_id="over", attempt_timeout=0.2, retry_limit=0)

    def handler(context):
        time.sleep(0.6)  # past its attempt_timeout: the timer marks it cancelled
        assert context.is_cancelled()
        context.sleep("nap", 60)

    HOOKS["over"] = handler
    status = run_claim(executor, claim_one(executor.storage))
    info = executor.get_task("over")
    assert status is not TaskStatus.PENDING, (info.status, info.attempts, info.waiting)


def test_a_claimed_resumption_is_not_made_available_again_by_its_tasks_ending(executor, clock):
    """A wait_for waiter claimed at its timeout (not started yet) when its awaited task
    ends: the claim must stay the claim's (not made available for another worker)."""
    executor.submit("contract.hook", None, task_id="child", queue="kids")
    executor.submit("contract.hook", None, task_id="parent")
    HOOKS["parent"] = lambda context: context.wait_for("kids", ["child"], timeout=30)
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    clock.advance(31)
    first = claim_one(executor.storage, "w1")  # the resumption, claimed by w1
    assert first.task_id == "parent"
    HOOKS["child"] = lambda context: "done"
    assert run_claim(executor, claim_one(executor.storage, "w3", "kids")) is TaskStatus.COMPLETED
    again = executor.storage.claim("w2", ["default"], 10, LEASE)
    assert [c.task_id for c in again] == [], "claimed twice"


def test_released_resumption_is_not_shown_or_counted_as_waiting(executor, clock):
    """A resumption claimed, then handed back (release, or a claim recovered) is due: it no
    longer waits. Both storages should agree on TaskInfo.waiting and count_waiting."""
    executor.submit("contract.hook", None, task_id="e")
    HOOKS["e"] = lambda context: context.wait_for_event("go")
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    executor.send_event("e", "go", 1)
    claim = claim_one(executor.storage)
    executor.storage.release([claim])
    info = executor.get_task("e")
    assert (info.waiting, executor.count_waiting()["event"]) == (None, 0)


def test_wait_for_itself_is_refused(executor, clock):
    executor.submit("contract.hook", None, task_id="me", retry_limit=0)
    HOOKS["me"] = lambda context: context.wait_for("self", [context.task_id])
    status = run_claim(executor, claim_one(executor.storage))
    info = executor.get_task("me")
    assert status is not TaskStatus.PENDING, info.waiting


def test_a_step_named_as_a_stored_wait_is_refused(executor, clock):
    executor.submit("contract.hook", None, task_id="n", retry_limit=0)

    def handler(context):
        if context.resumptions == 0:
            context.sleep("x", 1)
        return context.step("x", lambda: "ran")

    HOOKS["n"] = handler
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    clock.advance(2)
    run_claim(executor, claim_one(executor.storage))
    info = executor.get_task("n")
    assert info.status is TaskStatus.FAILED
    assert "the task stored a wait of that name" in info.last_error


def test_a_second_send_does_not_steal_the_claim_of_the_resumption(executor, clock):
    """An event sent twice (a retried webhook): the first wakes the task, a worker claims
    it; the second send must leave that claim alone (not make the row available again)."""
    executor.submit("contract.hook", None, task_id="hook2")
    HOOKS["hook2"] = lambda context: context.wait_for_event("go")
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    assert executor.send_event("hook2", "go", 1)
    first = claim_one(executor.storage, "w1")
    assert executor.send_event("hook2", "go", 1)  # the duplicate
    again = executor.storage.claim("w2", ["default"], 10, LEASE)
    assert [c.task_id for c in again] == [], "claimed twice"
    assert executor.storage.start(first, LEASE) is not None, "w1's claim was taken from it"


def test_a_long_wait_for_survives_the_purge_of_a_task_that_ended_early(executor, clock):
    """wait_for(["a", "b"]): "a" ends on day 1 and is purged (FINISHED_RETENTION) before "b"
    ends on day 30. The waiter is woken by b's ending, and its resumed call must return."""
    for task_id in ("a", "b"):
        executor.submit("contract.hook", None, task_id=task_id, queue="kids")
    executor.submit("contract.hook", None, task_id="w", retry_limit=0)
    HOOKS["w"] = lambda context: sorted(context.wait_for("kids", ["a", "b"]))
    assert run_claim(executor, claim_one(executor.storage)) is TaskStatus.PENDING
    HOOKS["a"] = HOOKS["b"] = lambda context: "done"
    claims = {c.task_id: c for c in executor.storage.claim("w3", ["kids"], 10, LEASE)}
    assert run_claim(executor, claims["a"]) is TaskStatus.COMPLETED
    executor.storage.release([claims["b"]])
    clock.advance(8 * 86400)
    executor.purge_finished(clock.now() - dt.timedelta(days=7))
    assert executor.get_task("a") is None
    assert run_claim(executor, claim_one(executor.storage, "w3", "kids")) is TaskStatus.COMPLETED
    status = run_claim(executor, claim_one(executor.storage))
    info = executor.get_task("w")
    assert status is TaskStatus.COMPLETED, (info.status, info.last_error)
