"""``rate_limit`` on the database storage: when its log entries are stamped, read from the log
table itself (``reliable_executor_rate_log``) on SQLite, MariaDB and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

from django_reliable_executor.core.rate_limits import RateLimit
from django_reliable_executor.models import ReliableNameLock, ReliableRateLog, ReliableTask
from tests.conftest import db_params, require
from tests.support.contract_support import LEASE

RATED = "demo.echo"
OTHER = "demo.noop"
TEN_PER_SECOND = RateLimit(10, 1.0)  # margin 0.1 s, lead 0.5 s, fresh 0.05 s, log window 1.1 s
LEAD = dt.timedelta(seconds=TEN_PER_SECOND.lead_seconds)
DATABASES = db_params(["default", "mariadb", "postgres"])


def logged(alias: str) -> dict[dt.datetime, int]:
    """{time: the claims logged at it} of the log, every key together."""
    counts: dict[dt.datetime, int] = {}
    for at, claims in ReliableRateLog.objects.using(alias).values_list("claimed_at", "claims"):
        counts[at] = counts.get(at, 0) + claims
    return counts


def rows(alias: str) -> int:
    return ReliableRateLog.objects.using(alias).count()


def claim(storage, limit: int, start: int = 0):
    return storage.claim(
        "w1", ["default"], limit, LEASE, rate_limits={RATED: TEN_PER_SECOND}, start=start
    )


@pytest.mark.parametrize("alias", DATABASES)
def test_a_claim_in_a_half_empty_window_logs_its_entries_ahead(alias, executor, storage, clock):
    """While its key's window stays at most half full, a claim logs its entries half a window
    ahead (about when they will start after waiting in the worker's local queue); past half,
    at the claim's time."""
    require(alias)
    for i in range(12):
        executor.submit(RATED, i)
    first_at = clock.now()
    first = claim(storage, 3)
    assert len(first) == 3
    ahead = first_at + LEAD
    assert {c.rate_logged_at for c in first} == {ahead}
    assert logged(alias) == {ahead: 3}
    clock.advance(0.01)
    second_at = clock.now()
    second = claim(storage, 5)  # 3 + 5 entries: more than half of 10
    assert {c.rate_logged_at for c in second} == {second_at}
    assert logged(alias) == {ahead: 3, second_at: 5}
    assert rows(alias) == 2  # one row per claim round, counting its claims


@pytest.mark.parametrize("alias", DATABASES)
def test_a_start_moves_only_an_entry_it_started_too_late_for(alias, executor, storage, clock):
    """A claim logged ahead and started within half a margin of its entry keeps it; one
    started later moves it to its start; one started after the entry left the window is
    handed back."""
    require(alias)
    for i in range(3):
        executor.submit(RATED, i)
    claimed_at = clock.now()
    on_time, late, too_late = claim(storage, 3)
    entry = claimed_at + LEAD
    clock.advance(0.54)  # 0.04 s after its entry: no move
    assert storage.start(on_time, LEASE) is not None
    assert logged(alias) == {entry: 3}
    clock.advance(0.06)  # 0.1 s after its entry: moved to the start
    started_at = clock.now()
    assert storage.start(late, LEASE) is not None
    assert logged(alias) == {entry: 2, started_at: 1}
    clock.advance(1.05)  # 1.15 s after its entry: out of the window (1.1 s)
    assert storage.start(too_late, LEASE) is None
    assert logged(alias) == {entry: 2, started_at: 1}  # nothing moved
    task = executor.get_task(too_late.task_id)
    assert (task.worker_id, task.attempts) == (None, 0)


@pytest.mark.parametrize("alias", DATABASES)
def test_a_late_start_that_waits_for_the_name_lock_stores_the_time_it_logs(
    alias, executor, storage, make_storage, clock
):
    """A start that moves its entry but first waits for the name's lock (another worker's
    claim holds it) stores as its start the time it moved the entry to, read once the lock is
    held. Stamped with the time before the wait, entries and stored starts parted by the wait,
    and two rounds of five stored starts of a "5/s" name came 0.8 s apart here (seen in the
    chaos soak: six stored starts within 1.032 s)."""
    require(alias)
    five = RateLimit(5, 1.0)
    for i in range(10):
        executor.submit(RATED, i)
    first = storage.claim("w1", ["default"], 5, LEASE, rate_limits={RATED: five}, start=0)
    assert len(first) == 5
    clock.advance(0.7)  # stale (past half the margin), still in the log window (1.1 s)
    holder = make_storage(clock)
    held, release, results = threading.Event(), threading.Event(), []

    def hold_the_name_lock() -> None:
        try:
            with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
                table = connections[alias].ops.quote_name(ReliableNameLock._meta.db_table)
                holder._lock_name(cursor, table, RATED)
                held.set()
                release.wait(30)
        finally:
            connections.close_all()

    def start() -> None:
        try:
            results.extend(storage.start_many(first, LEASE))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=hold_the_name_lock), threading.Thread(target=start)]
    threads[0].start()
    assert held.wait(30)
    threads[1].start()
    time.sleep(0.5)  # the start has read the clock and waits for the lock
    clock.advance(0.3)  # 1.0 s after the entries: still in the window
    started_at = clock.now()
    release.set()
    for thread in threads:
        thread.join(60)
    assert all(result is not None for result in results) and len(results) == 5
    stored = {executor.get_task(c.task_id).started_at for c in first}
    assert stored == {started_at}
    assert logged(alias) == {started_at: 5}
    # The window frees a window and margin after the stored starts, not before.
    clock.advance(1.09)
    assert storage.claim("w1", ["default"], 5, LEASE, rate_limits={RATED: five}) == []
    clock.advance(0.02)
    assert len(storage.claim("w1", ["default"], 5, LEASE, rate_limits={RATED: five})) == 5


@pytest.mark.parametrize("alias", DATABASES)
def test_entries_out_of_the_window_are_never_counted_and_trimmed_once_per_margin(
    alias, executor, storage, clock
):
    """A claim counts the entries in its window only; those out of it are deleted by a claim
    at most once per margin (housekeeping), and count for nothing meanwhile."""
    require(alias)
    for i in range(14):
        executor.submit(RATED, i)
    assert len(claim(storage, 6)) == 6  # more than half of 10: logged at the claim's time
    clock.advance(1.05)
    assert len(claim(storage, 4)) == 4  # 6 + 4: the window is full; trimmed, nothing out
    clock.advance(0.06)  # the first 6 entries left the window (1.1 s); the last trim 0.06 ago
    assert len(claim(storage, 6)) == 4  # room for 6, 4 waiting
    assert sum(logged(alias).values()) == 14  # not trimmed yet, and not counted
    clock.advance(0.04)  # a margin (0.1 s) since the last trim
    executor.submit(RATED, 14)
    assert len(claim(storage, 6)) == 1
    assert sum(logged(alias).values()) == 9  # 4 + 4 + 1: the first 6 trimmed


@pytest.mark.parametrize("alias", DATABASES)
def test_an_entry_older_than_the_last_trim_is_deleted_by_the_whole_trim_a_minute_on(
    alias, executor, storage, clock
):
    """Each trim reads the range since the last one; an entry stamped earlier (a worker whose
    clock lags) is left to the whole trim, once a minute, and counts for nothing meanwhile."""
    require(alias)
    for i in range(4):
        executor.submit(RATED, i)
    assert len(claim(storage, 1)) == 1  # the first trim of the name: the whole range
    lagging = clock.now() - dt.timedelta(seconds=2)  # before the first trim's range
    ReliableRateLog.objects.using(alias).create(name=RATED, claimed_at=lagging)
    clock.advance(5)
    assert len(claim(storage, 1)) == 1  # trims from the last cutoff less a margin: not it
    assert lagging in logged(alias)
    clock.advance(60)
    assert len(claim(storage, 1)) == 1  # the whole range again
    assert lagging not in logged(alias)


@pytest.mark.parametrize("alias", DATABASES)
def test_a_claim_logs_one_entry_per_key_and_time_counting_its_claims(
    alias, executor, storage, clock
):
    """A claim logs one entry per rate key ("" for none) and time, counting the tasks of
    that key it took: ahead for a key the claim leaves at most half full and at the claim's
    time for a fuller one, both in the same claim. Claims handed back and claimed again are
    logged again."""
    require(alias)
    key_of = {}
    for key in ["a"] * 6 + ["b"] * 2 + [None] * 2:
        key_of[executor.submit(RATED, None, rate_key=key).task_id] = key or ""
        clock.advance(0.001)
    storage.release(claim(storage, 2))  # claimed again below
    clock.advance(2)  # their entries out of the window
    claimed_at = clock.now()
    claims = claim(storage, 10)
    assert len(claims) == 10
    ahead = claimed_at + LEAD
    stamps = {"a": claimed_at, "b": ahead, "": ahead}  # a: 6 of 10, more than half
    assert {c.task_id: c.rate_logged_at for c in claims} == {
        task_id: stamps[key] for task_id, key in key_of.items()
    }
    assert {c.task_id: c.rate_key for c in claims} == key_of
    entries = ReliableRateLog.objects.using(alias).filter(claimed_at__gte=claimed_at)
    assert sorted(entries.values_list("rate_key", "claims", "claimed_at")) == [
        ("", 2, ahead),
        ("a", 6, claimed_at),
        ("b", 2, ahead),
    ]


@pytest.mark.parametrize("alias", DATABASES)
def test_late_starts_take_their_claims_out_of_every_entry_of_their_key_and_time(
    alias, executor, storage, clock
):
    """Two claim rounds logged at the same time (one clock for both) make two entries; late
    starts of claims from both take their claims out of either, deleting an entry left with
    none, and log them at the start's time under their own key, in one entry per key."""
    require(alias)
    for key in ["a", "a", "b", "a"]:
        executor.submit(RATED, None, rate_key=key)
        clock.advance(0.001)
    claimed_at = clock.now()
    first, second = claim(storage, 2), claim(storage, 2)  # 2 + 2 of 10: both ahead
    entry = claimed_at + LEAD
    assert (logged(alias), rows(alias)) == ({entry: 4}, 3)  # a 2; a 1, b 1
    clock.advance(0.6)  # 0.1 s after the entries: each start moves its claim
    started_at = clock.now()
    of_a = [c for c in [*first, *second] if c.rate_key == "a"]
    assert len(of_a) == 3 and all(storage.start_many(of_a, LEASE))
    log = ReliableRateLog.objects.using(alias).values_list("rate_key", "claims", "claimed_at")
    assert sorted(log) == [("a", 3, started_at), ("b", 1, entry)]


def statements(captured: CaptureQueriesContext) -> tuple[list[str], list[str]]:
    """The captured queries, and the first word of each (upper case)."""
    queries = [query["sql"] for query in captured.captured_queries]
    return queries, [query.split()[0].upper() for query in queries]


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_a_claim_far_below_its_limit_on_sqlite_runs_no_transaction(alias, executor, storage, clock):
    """On SQLite a rate-limited name far below its limit is claimed without a transaction,
    each statement holding the write lock only while it runs: the tasks to take are read
    (by the round's read of what is due), then logged ahead by one statement that counts the
    window itself, and only then claimed by id; the other names are claimed by a statement
    of their own."""
    rated = [executor.submit(RATED, i).task_id for i in range(3)]
    others = [executor.submit(OTHER, None).task_id for _ in range(2)]
    with CaptureQueriesContext(connections[alias]) as captured:
        claims = storage.claim(
            "w1", ["default"], 10, LEASE, rate_limits={RATED: RateLimit(100, 1.0)}
        )
    assert sorted(c.task_id for c in claims) == sorted(rated + others)
    assert (logged(alias), rows(alias)) == ({clock.now() + LEAD: 3}, 1)
    queries, sql = statements(captured)
    assert "BEGIN" not in sql and "COMMIT" not in sql
    logging = sql.index("INSERT")
    assert "reliable_executor_rate_log" in queries[logging]
    # One read before it: the round's read of what is due returned the tasks to take.
    assert [word for word in sql[:logging] if word != "DELETE"] == ["SELECT"]
    claiming = [i for i, q in enumerate(queries) if q.startswith('UPDATE "reliable_executor_task"')]
    assert len(claiming) == 2 and logging < claiming[0]  # logged before it is claimed
    assert all(rated_id in queries[claiming[0]] for rated_id in rated)


@pytest.mark.parametrize("alias", db_params(["default"]))
def test_a_reservation_left_without_its_tasks_is_taken_back(
    alias, executor, storage, clock, monkeypatch
):
    """Tasks read for a claim far below its limit but claimed by another worker before it
    (here: started by hand in between) are taken out of its log entry again."""
    from django_reliable_executor.storage.database import claiming

    ids = [executor.submit(RATED, i).task_id for i in range(4)]
    update_sql = claiming.Claiming._claim_update_sql

    def taken_meanwhile(self, pick, returning):
        if pick.ids:  # the claim by id, after the reservation: two of its tasks are gone
            ReliableTask.objects.using(alias).filter(task_id__in=ids[:2]).update(available=False)
        return update_sql(self, pick, returning)

    monkeypatch.setattr(claiming.Claiming, "_claim_update_sql", taken_meanwhile)
    claims = claim(storage, 10)
    assert sorted(c.task_id for c in claims) == sorted(ids[2:])
    assert logged(alias) == {clock.now() + LEAD: 2}


@pytest.mark.parametrize("alias", db_params(["default"]))
@pytest.mark.parametrize("mode", ["IMMEDIATE", None])
def test_a_claim_round_near_its_limit_on_sqlite_is_one_write_transaction(
    alias, mode, executor, storage, clock
):
    """On SQLite a round with a rate-limited name near its limit takes the write lock once:
    the name and the other names are claimed in one transaction, after the reads that find
    the name due (and the attempt to log the name's tasks far below its limit, which logs
    nothing). When the BEGIN took the write lock (transaction_mode IMMEDIATE) the name's lock
    row is not written; a deferred BEGIN writes it first, before the window is read."""
    first = [executor.submit(RATED, i).task_id for i in range(4)]
    assert sorted(c.task_id for c in claim(storage, 4)) == sorted(first)  # 4 of 10 logged
    rated = [executor.submit(RATED, i).task_id for i in range(3)]
    others = [executor.submit(OTHER, None).task_id for _ in range(2)]
    connection = connections[alias]
    configured = connection.transaction_mode
    connection.transaction_mode = mode
    try:
        with CaptureQueriesContext(connection) as captured:
            claims = claim(storage, 10)  # 4 + 3 of 10: more than half full
    finally:
        connection.transaction_mode = configured
    assert sorted(c.task_id for c in claims) == sorted(rated + others)
    assert logged(alias) == {clock.now() + LEAD: 4, clock.now(): 3}
    queries, sql = statements(captured)
    assert (sql.count("BEGIN"), sql.count("COMMIT"), sql[-1]) == (1, 1, "COMMIT")
    begin = sql.index("BEGIN")
    assert set(sql[:begin]) == {"SELECT", "INSERT"}  # the reservation that logged nothing
    claiming = [q for q in queries[begin:] if q.startswith('UPDATE "reliable_executor_task"')]
    assert len(claiming) == 2  # the rated name's claim and the other names'
    locked = [i for i, query in enumerate(queries) if "reliable_executor_name_lock" in query]
    if mode is None:
        assert locked and locked[0] == begin + 1
    else:
        assert locked == []
    # The next round, still near the limit, goes straight to the transaction.
    executor.submit(RATED, 3)
    with CaptureQueriesContext(connection) as captured:
        assert len(claim(storage, 10)) == 1
    queries, sql = statements(captured)
    begin = sql.index("BEGIN")
    assert set(sql[:begin]) == {"SELECT"}


@pytest.mark.parametrize("alias", DATABASES)
def test_a_round_claims_the_other_names_only_when_its_read_found_one_due(
    alias, executor, storage, clock
):
    """The read that finds which limited names have tasks due also finds whether any other
    name has one: an idle round writes nothing, and a round with only a rate-limited name's
    tasks due runs no claim of the other names."""
    require(alias)
    connection = connections[alias]

    def writes(queries) -> list[str]:
        return [q["sql"] for q in queries if not q["sql"].startswith(("SELECT", "BEGIN"))]

    def of_others(queries) -> list[str]:
        """The claims of the other names (every name but the limited ones), not the read."""
        return [
            q["sql"] for q in queries if "task_name NOT IN" in q["sql"] and "UNION" not in q["sql"]
        ]

    with CaptureQueriesContext(connection) as idle:
        assert claim(storage, 10) == []
    assert writes(idle.captured_queries) == []
    rated = {executor.submit(RATED, i).task_id for i in range(3)}
    with CaptureQueriesContext(connection) as only_rated:
        assert {c.task_id for c in claim(storage, 10)} == rated
    assert of_others(only_rated.captured_queries) == []
    other = executor.submit(OTHER, None).task_id
    with CaptureQueriesContext(connection) as only_other:
        assert [c.task_id for c in claim(storage, 10)] == [other]
    assert len(of_others(only_other.captured_queries)) == 1
