"""``rate_limit``: at most N tasks of a name (per ``rate_key``) claimed in any window, across
every worker, enforced by the storage at claim time on all four backends (real servers, no
mocks); and the same from the handlers' own records with real worker processes."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from django_reliable_executor import TaskStatus, reliable_task_handler
from django_reliable_executor.core.rate_limits import RateLimit, parse_rate_limit
from django_reliable_executor.core.records import Claim
from django_reliable_executor.exceptions import HandlerRegistrationError, InvalidTaskOptionError
from django_reliable_executor.registry import get_handler, rate_limits, unregister
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.base import TaskStorage
from tests.conftest import db_params, require
from tests.support.contract_support import LEASE, at_once
from tests.support.processes import (
    FAST,
    Backend,
    most_in_a_window,
    read_journal,
    service_for,
    wait_until,
)

RATED = "demo.echo"
OTHER = "demo.noop"
FIVE_PER_SECOND = RateLimit(5, 1.0)  # log window 1.1 s


def consistent(storage: TaskStorage) -> None:
    """On Redis, every index agrees with the tasks."""
    from django_reliable_executor.storage.redis import RedisStorage

    if isinstance(storage, RedisStorage):
        from tests.support.redis_support import assert_consistent

        assert_consistent(storage)


def claim(
    storage: TaskStorage,
    rate: RateLimit = FIVE_PER_SECOND,
    worker: str = "w1",
    limit: int = 20,
    start: int = 20,
) -> list[Claim]:
    claims = storage.claim(
        worker, ["default"], limit, LEASE, rate_limits={RATED: rate}, start=start
    )
    consistent(storage)
    return claims


def names(claims: list[Claim]) -> list[str]:
    return sorted(c.task.task_name for c in claims)


# -- the decorator and the submit option -----------------------------------------------------


@pytest.mark.parametrize("value", ["10/x", "0/s", "-1/m", "abc", "", 5, 1.5, None.__class__])
def test_a_bad_rate_limit_is_refused_at_decoration(value):
    with pytest.raises(HandlerRegistrationError) as excinfo:

        @reliable_task_handler(name="tests.bad_rate", rate_limit=value)
        def bad() -> None: ...

    assert "rate_limit must be" in str(excinfo.value)
    assert "tests.bad_rate" in str(excinfo.value)
    assert get_handler("tests.bad_rate") is None


def test_rate_limits_parse_and_are_listed():
    assert parse_rate_limit("10/s") == RateLimit(10, 1.0)
    assert parse_rate_limit("3/m") == RateLimit(3, 60.0)
    assert parse_rate_limit("100/h") == RateLimit(100, 3600.0)
    assert RateLimit(10, 1.0).log_window_seconds == pytest.approx(1.1)
    assert RateLimit(3, 60.0).log_window_seconds == pytest.approx(61.0)

    @reliable_task_handler(name="tests.rated_three", rate_limit="3/m")
    def rated_three() -> None: ...

    try:
        assert rated_three.rate_limit == RateLimit(3, 60.0)
        assert rate_limits()["tests.rated_three"] == RateLimit(3, 60.0)
        assert rate_limits()["demo.rated"] == RateLimit(5, 1.0)
        assert "demo.echo" not in rate_limits()
    finally:
        unregister("tests.rated_three")


@pytest.mark.parametrize("value", [5, "", "x" * 192, b"key"])
def test_a_bad_rate_key_is_refused_and_nothing_stored(executor, value):
    with pytest.raises(InvalidTaskOptionError) as excinfo:
        executor.submit(RATED, 1, task_id="bad-key", rate_key=value)
    assert excinfo.value.field == "rate_key"
    assert "rate_key" in str(excinfo.value)
    assert executor.get_task("bad-key") is None


# -- the storage contract ---------------------------------------------------------------------


def test_the_limit_holds_until_the_window_frees(executor, storage, clock):
    ids = []
    for i in range(12):
        ids.append(executor.submit(RATED, i, task_id=f"t{i:02d}").task_id)
        clock.advance(0.001)  # distinct run_at: the claim order is exact
    first = claim(storage)
    assert [c.task_id for c in first] == ids[:5]  # the claim order is kept
    assert claim(storage, worker="w2") == []
    # Finishing a claim frees nothing: the window counts starts, not running tasks.
    for one in first[:2]:
        started = one if one.is_started else storage.start(one, LEASE)
        assert started is not None and storage.complete(started, None) is not None
    assert claim(storage, worker="w2") == []
    clock.advance(0.5)
    assert claim(storage) == []
    # The window (1 s, plus its margin of 0.1 s) has passed since the first claims.
    clock.advance(0.61)
    assert [c.task_id for c in claim(storage, worker="w2")] == ids[5:10]
    assert claim(storage) == []
    clock.advance(1.2)
    assert [c.task_id for c in claim(storage)] == ids[10:12]
    consistent(storage)


def test_a_changed_limit_plans_the_held_backlog_again(executor, make_storage, clock):
    """A deploy changes the name's limit (each deploy's worker a storage of its own, as a new
    process): the tasks held back under "2/h" are claimed under the limit the claim has, at
    once: "4/h" takes two more (the window holds two already), and a claim with no limit for
    the name (removed) takes every other one."""
    ids = [executor.submit(RATED, i, task_id=f"t{i:02d}").task_id for i in range(10)]
    old, raised_to, removed = make_storage(clock), make_storage(clock), make_storage(clock)
    first = claim(old, RateLimit(2, 3600.0))
    assert len(first) == 2
    clock.advance(60)
    assert claim(old, RateLimit(2, 3600.0)) == []  # held for later slots
    raised = claim(raised_to, RateLimit(4, 3600.0))
    assert len(raised) == 2
    clock.advance(60)
    assert claim(raised_to, RateLimit(4, 3600.0)) == []
    rest = removed.claim("w1", ["default"], 20, LEASE, start=20)
    consistent(removed)
    assert sorted(c.task_id for c in first + raised + rest) == ids


def test_rate_keys_have_their_own_limits(executor, storage, clock):
    for i in range(4):
        for key in ("customer:1", "customer:2", None):
            executor.submit(RATED, i, rate_key=key)
            clock.advance(0.001)
    claims = claim(storage, RateLimit(2, 60.0))
    assert len(claims) == 6  # two of each key, the name's own limit being one of them
    assert claim(storage, RateLimit(2, 60.0)) == []
    stored = {c.task_id: executor.get_task(c.task_id) for c in claims}
    assert len(stored) == 6
    clock.advance(62)
    assert len(claim(storage, RateLimit(2, 60.0))) == 6


def test_other_names_flow_past_a_held_name(executor, storage, clock):
    for i in range(30):
        executor.submit(RATED, i, priority=5)
    clock.advance(0.01)
    others = [executor.submit(OTHER, None).task_id for _ in range(5)]
    claims = claim(storage, RateLimit(3, 1.0))
    assert names(claims) == [RATED] * 3 + [OTHER] * 5
    assert {c.task_id for c in claims if c.task.task_name == OTHER} == set(others)
    late = executor.submit(OTHER, None).task_id
    assert [c.task_id for c in claim(storage, RateLimit(3, 1.0), worker="w2")] == [late]
    listed = executor.list_tasks(status=TaskStatus.CREATED, task_name=RATED, limit=100)
    assert len([t for t in listed if t.worker_id is None]) == 27  # waiting, nobody's


def test_a_start_moves_the_logged_claim_to_the_start(executor, storage, clock):
    """A claim started later than claimed counts from its start: the window frees a window
    after the start, not after the claim."""
    for i in range(10):
        executor.submit(RATED, i)
    first = claim(storage, start=0)  # none started by the claim itself
    assert len(first) == 5
    clock.advance(1.0)
    assert all(storage.start(c, LEASE) is not None for c in first)
    clock.advance(0.2)  # 1.2 s after the claims, 0.2 s after the starts
    assert claim(storage, start=0) == []
    clock.advance(0.91)  # 1.11 s after the starts
    assert len(claim(storage, start=0)) == 5
    consistent(storage)


def test_a_claim_that_waited_past_its_window_is_handed_back_at_its_start(executor, storage, clock):
    for i in range(2):
        executor.submit(RATED, i)
    [late, _] = claim(storage, start=0)
    # Longer than the lead a database logs it with (half the window: 0.5 s, see
    # test_rate_limits_log.py), the window (1 s) and its margin (0.1 s).
    clock.advance(1.7)
    assert storage.start(late, LEASE) is None
    task = executor.get_task(late.task_id)
    assert (task.status, task.attempts, task.worker_id) == (TaskStatus.CREATED, 0, None)
    consistent(storage)
    again = claim(storage, start=0)
    assert [c.task_id for c in again] == [late.task_id]  # waiting again, claimed again
    assert all(storage.start(c, LEASE) is not None for c in again)
    consistent(storage)


def test_entries_logged_ahead_never_free_room_early(executor, storage, clock):
    """Claims started a little late (past half the margin, within the lead a database logs
    them with) and claims started at once: no room frees before a window (and margin) has
    passed since each start; an entry logged ahead of its start frees its room a window after
    itself (it only counts longer)."""
    for i in range(12):
        executor.submit(RATED, i)
    rate = RateLimit(4, 1.0)
    early = claim(storage, rate, limit=2, start=0)  # the window half full with them
    clock.advance(0.12)
    started_at = clock.now()
    assert all(storage.start(c, LEASE) is not None for c in early)
    assert len(claim(storage, rate, limit=2)) == 2  # started by the claim itself
    assert claim(storage, rate) == []
    counted = dt.timedelta(seconds=rate.log_window_seconds)
    frees = [max(started_at, c.rate_logged_at or started_at) + counted for c in early]
    frees += [started_at + counted] * 2
    clock.advance(1.07)  # 1.19 s after the claims, 1.07 s after every start
    assert claim(storage, rate) == []
    clock.advance(0.06)  # 1.13 s after every start: the window and margin passed
    freed = [at for at in frees if at <= clock.now()]
    assert len(freed) >= 2  # the claims logged at their start, at least
    assert len(claim(storage, rate)) == len(freed)
    # The latest entry's window passed too.
    clock.advance((max(frees) - clock.now()).total_seconds())
    assert len(claim(storage, rate)) == 4 - len(freed)
    consistent(storage)


def test_a_limit_far_above_its_use_counts_each_key_apart(executor, storage, clock):
    """A claim with room for its whole batch in every key still logs each task under its own
    key: the next claim finds the busy key's room smaller."""
    rate = RateLimit(12, 60.0)
    for key in ["a"] * 8 + ["b"] * 2:
        executor.submit(RATED, None, rate_key=key)
        clock.advance(0.001)
    assert len(claim(storage, rate, limit=10)) == 10
    key_of = {}
    for key in ["a"] * 8 + ["b"] * 2:
        key_of[executor.submit(RATED, None, rate_key=key).task_id] = key
        clock.advance(0.001)
    taken = claim(storage, rate, limit=10)
    keys = sorted(key_of[c.task_id] for c in taken)
    assert keys == ["a"] * 4 + ["b"] * 2  # a: 12 - 8 left; b: room for both
    [use] = storage.rate_use({RATED: rate})
    assert (use.started, use.busiest, use.keys) == (16, 12, 2)
    consistent(storage)


def test_concurrent_claims_never_exceed_the_limit(executor, make_storage, clock):
    """Workers with their own connections claim at once: the limit holds, per window."""
    for i in range(30):
        executor.submit(RATED, i)
    taken: list[str] = []
    storages = [make_storage(clock) for _ in range(5)]

    def work(storage: TaskStorage, worker: str) -> None:
        for _ in range(20):
            claims = storage.claim(
                worker, ["default"], 4, LEASE, rate_limits={RATED: FIVE_PER_SECOND}, start=4
            )
            taken.extend(c.task_id for c in claims)

    at_once(storages, work)
    assert len(taken) == 5 and len(set(taken)) == 5
    consistent(storages[0])


@pytest.mark.parametrize("keys", [[None], ["a", "b"]])
def test_concurrent_claims_far_below_and_near_the_limit_never_exceed_it(
    executor, make_storage, clock, keys
):
    """Eight workers claim four at a time under a limit of 40 per second: their first claims
    are far below it (on SQLite logged ahead without a transaction), the later ones near it
    (counted per key); on the frozen clock exactly 40 tasks of each key are taken."""
    rate = RateLimit(40, 1.0)
    key_of = {
        executor.submit(RATED, i, rate_key=key).task_id: key for key in keys for i in range(60)
    }
    taken: list[str] = []
    storages = [make_storage(clock) for _ in range(8)]

    def work(storage: TaskStorage, worker: str) -> None:
        for _ in range(15):
            claims = storage.claim(worker, ["default"], 4, LEASE, rate_limits={RATED: rate})
            taken.extend(c.task_id for c in claims)

    at_once(storages, work)
    assert len(set(taken)) == len(taken)
    assert sorted(str(key_of[t]) for t in taken) == sorted(str(k) for k in keys * 40)
    consistent(storages[0])


def test_an_idle_worker_waits_until_the_window_frees(executor, storage, clock):
    """Held back at its limit, the next task of the name ends an idle worker's wait when its
    window frees (not after POLL_INTERVAL), and never at once (no busy loop)."""
    for i in range(6):
        executor.submit(RATED, i)
    assert len(claim(storage)) == 5
    assert claim(storage) == []
    # The fake clock stands still: the window frees 1.1 s from now as the storage sees it.
    # Far below POLL_INTERVAL (30 s here); a wait ended by an earlier submit's wake-up is
    # simply waited again, as a worker would.
    began = time.monotonic()
    while time.monotonic() - began < 1.0:
        storage.wait_for_work(["default"], 30.0)
    assert time.monotonic() - began < 10
    clock.advance(1.11)
    assert len(claim(storage)) == 1


def test_the_use_of_each_limit_can_be_read(executor, storage, clock):
    rate = RateLimit(2, 60.0)
    for i in range(3):
        for key in ("a", "b", None):
            executor.submit(RATED, i, rate_key=key)
    claim(storage, rate, limit=3)  # a, b and the name's own: one each
    claim(storage, rate)  # one more each: all three at their limit
    [use] = storage.rate_use({RATED: rate, OTHER: rate})[:1]
    assert (use.task_name, use.limit, use.started, use.busiest, use.keys) == (
        RATED,
        rate,
        6,
        2,
        3,
    )
    assert use.held_back == 3  # the third of each key
    [other] = storage.rate_use({OTHER: rate})
    assert (other.started, other.busiest, other.keys, other.held_back) == (0, 0, 0, 0)
    clock.advance(61.5)
    [later] = storage.rate_use({RATED: rate})
    assert (later.started, later.held_back) == (0, 0)


def test_the_metrics_report_held_back_tasks_and_starts(executor, storage):
    from django_reliable_executor.observability.task_gauges import TaskCountCollector

    for _ in range(7):
        executor.submit("demo.rated", {})
    claims = storage.claim("w1", ["default"], 10, LEASE, rate_limits=rate_limits(), start=10)
    assert len(claims) == 5  # demo.rated: rate_limit="5/s"
    read = {
        family.name: {tuple(s.labels.values()): s.value for s in family.samples}
        for family in TaskCountCollector(executor, cache_seconds=0).collect()
    }
    assert read["reliable_executor_rate_limited_tasks"][("demo.rated",)] == 2
    assert read["reliable_executor_rate_limit_started"][("demo.rated",)] == 5


# -- real processes ---------------------------------------------------------------------------


@pytest.mark.parametrize("alias", db_params(["default", "mariadb", "postgres", "redis"]))
@pytest.mark.parametrize(("handler", "limit"), [("demo.rated", 5), ("demo.rated_wide", 40)])
def test_two_worker_processes_keep_the_rate_in_the_handlers_records(
    alias, handler, limit, key_prefix, workers, tmp_path: Path
):
    """demo.rated has rate_limit="5/s": two runexecutor processes of four threads each never
    let more than five handlers start in any second, by the handlers' own time.time(), while
    other work keeps flowing; every task completes. demo.rated_wide ("40/s") the same with 40:
    there each window's first claims are far below the limit (and take SQLite's claim without
    a transaction) and its last ones near it."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service: ReliableExecutor = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    rated = [service.submit(handler, {}).task_id for _ in range(4 * limit)]
    others = [service.submit("demo.echo", i).task_id for i in range(20)]
    env = {"RE_JOURNAL": str(journal)}
    # demo.rated_wide: claims of at most 8 (4 threads, a local queue of 4), so that 8 of 40
    # are far below the limit while the window holds at most 12.
    pool = ["--core-pool-size", "4", "--max-pool-size", "4"]
    if limit == 40:
        pool += ["--queue-capacity", "4"]
    started = [workers.start(backend, "--burst", *pool, env=env) for _ in range(2)]

    def finished() -> bool:
        return all(p.returncode is not None for p in started)

    wait_until(finished, 90, "the burst workers did not finish", logs=workers.logs)
    assert [p.returncode for p in started] == [0, 0], workers.logs()
    infos = [service.get_task(i) for i in rated + others]
    assert {i.status for i in infos} == {TaskStatus.COMPLETED}, workers.logs()
    records = read_journal(journal)
    handler_at = {r["task"]: r["at"] for r in records if r["event"] == "start"}
    assert sorted(handler_at) == sorted(rated)
    starts = list(handler_at.values())
    # The start writes (their started_at): the log keeps an entry W + margin (1.1 s) and a start
    # comes at most half a margin after its entry (else it moves it), so any six starts span
    # more than W + margin / 2 = 1.05 s (less 2 ms for the stored time's rounding).
    written = {i.task_id: i.started_at.timestamp() for i in infos if i.task_id in handler_at}
    assert most_in_a_window(list(written.values()), 1.05 - 0.002) <= limit, sorted(written.values())
    # The handlers' own clocks: six first lines span at least 1.05 s less the longest delay
    # between a start write and its handler's first line. The docs promise "at most 5 in any
    # second" while that delay stays within half the margin (50 ms); a loaded machine can delay
    # a handler longer, and then the window this checks shrinks by exactly that much.
    delay = max(0.0, max(handler_at[t] - written[t] for t in handler_at))
    window = min(1.0, 1.05 - delay - 0.002)
    assert most_in_a_window(starts, window) <= limit, (delay, sorted(starts))
    # It ran at its rate, no faster: 4 windows' worth of starts at N per 1.1 s take at least
    # three windows.
    assert max(starts) - min(starts) >= 3.0
    service.storage.close()


@pytest.mark.parametrize("alias", db_params(["default", "mariadb", "postgres", "redis"]))
def test_a_worker_killed_mid_drain_never_lets_the_rate_through(
    alias, key_prefix, workers, tmp_path: Path
):
    """A worker draining demo.rated_wide ("40/s", claims of at most 8: far below the limit at
    each window's start) is SIGKILLed mid-drain, its claims and log entries left behind; a
    second worker recovers its tasks once their leases lapse. Every task completes, and the
    handlers' own records, the killed worker's included, never show more than 40 starts in
    a window."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service: ReliableExecutor = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    rated = [service.submit("demo.rated_wide", {}).task_id for _ in range(160)]
    env = {"RE_JOURNAL": str(journal)}
    pool = ["--core-pool-size", "4", "--max-pool-size", "4", "--queue-capacity", "4"]

    def started() -> int:
        return len(journal.read_text().splitlines()) if journal.exists() else 0

    first = workers.start(backend, *pool, env=env, **FAST)
    wait_until(lambda: started() >= 50, 30, "the first worker never ran 50", logs=workers.logs)
    first.kill()
    workers.start(backend, *pool, env=env, **FAST)

    def all_done() -> bool:
        return all(service.get_task(i).status is TaskStatus.COMPLETED for i in rated)

    wait_until(all_done, 90, "not every task completed after the kill", logs=workers.logs)
    records = read_journal(journal)
    starts = [r["at"] for r in records if r["event"] == "start"]
    assert {r["task"] for r in records} == set(rated)
    # A window a margin shorter than the limit's: room for a handler begun late on a loaded
    # machine (see the test above); without the limit all 160 start within a fraction of it.
    assert most_in_a_window(starts, 0.9) <= 40, sorted(starts)
    service.storage.close()
