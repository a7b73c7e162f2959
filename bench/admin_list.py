#!/usr/bin/env python
"""How fast the admin's task list stays with 1,000,000 tasks in the store.

    python bench/admin_list.py --storage {sqlite,mariadb,postgres,redis} [--n 1000000]

Fills a store of its own (the database or key prefix of bench/throughput.py's stores, under
another name: ``reliable_executor_admin_bench``) with ``--n`` tasks, unless it already holds
exactly that many (``--refill`` starts over), then times what the admin's list and detail pages
ask the service for, and the whole pages rendered through the admin views:

* the service calls: first page, a page filtered by status / queue / task name, page 50 (offset
  4 900), the summary's ``count_by_queue``, ``oldest_due_at``, ``master``, ``workers``, and one
  ``get_task``; the summary's health parts: ``oldest_due_by_queue`` and ``throughput`` (the
  chart's tasks completed, failed and retried per minute over the last hour);
* the pages (their summary draws the chart and the ages): the list unfiltered, filtered by
  status, page 50, and one task's detail page (the list reuses its summary counts when
  counting was slow, as it does for users: see docs/admin.md), and the unfiltered list with
  the counts recomputed every time.

Each figure is the median of ``--rounds`` runs after one warm-up run, in milliseconds, with the
first (cold) run beside it. Prints one JSON line on stdout; progress goes to stderr.

Filling: on a database one ``INSERT ... SELECT`` over a generated series per 100 000 rows
(MariaDB's ``seq_1_to_N`` tables, PostgreSQL's ``generate_series``, a recursive CTE on SQLite):
85 % COMPLETED, 5 % FAILED, 4 % CREATED, 2 % PENDING, the rest CANCELLED/TIMEOUT/ERROR, over
three queues and seven task names, created 0.6 s apart (a week's retention of 1,000,000: the
last hour holds 6,000 endings, which the chart reads), and the retry counts of the last two
hours (one row a minute). On Redis the tasks are submitted with
``submit_many`` and then taken through the storage's own claim/start/complete/fail transitions
in batches (the oldest ones finish, the newest stay CREATED), so every index is what real work
leaves behind.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores of the throughput benchmark, reused

DEFAULT_NAME = "reliable_executor_admin_bench"
QUEUES = ["default"] * 7 + ["emails"] * 2 + ["reports"]
TASK_NAMES = [f"bench.task_{i}" for i in range(7)]
# g % 100 -> status, as in the SQL below.
SHARES = [
    ("COMPLETED", 85),
    ("FAILED", 5),
    ("CREATED", 4),
    ("PENDING", 2),
    ("CANCELLED", 2),
    ("TIMEOUT", 1),
    ("ERROR", 1),
]
CHUNK = 100_000
# SQL string literals of the JSON parameter and result: '{"order_id": ' || n || '}'.
QUOTED_PARAMETER = """'{"order_id": '"""
QUOTED_RESULT = """'{"charged": '"""
QUOTED_CLOSE = "'}'"


def log(message: str) -> None:
    throughput.log(message)


# -- filling a database ------------------------------------------------------------------------
def _status_case(g: str) -> str:
    parts, low = [], 0
    for status, share in SHARES:
        parts.append(f"WHEN MOD({g}, 100) < {low + share} THEN '{status}'")
        low += share
    return "CASE " + " ".join(parts) + " END"


def _fill_sql(vendor: str, table: str, n: int) -> str:
    """INSERT ... SELECT over the series ``first..last``. Placeholders: the base time once per
    timestamp expression, then ``first`` and ``last``."""
    g = "g.n"
    if vendor == "postgresql":

        def text(expr: str) -> str:
            return f"({expr})::text"

        def at(offset_ms: int) -> str:
            return f"(%s::timestamptz + ({g} * 600 + {offset_ms}) * interval '1 millisecond')"

        series = "(SELECT generate_series(%s::bigint, %s::bigint) AS n) g"
        task_id, json_cast, true, false = f"md5({text(g)})", "::jsonb", "true", "false"
    elif vendor == "mysql":

        def text(expr: str) -> str:
            return f"CAST({expr} AS CHAR)"

        def at(offset_ms: int) -> str:
            return (
                f"(CAST(%s AS DATETIME(6)) + INTERVAL ({g} * 600 + {offset_ms}) * 1000 MICROSECOND)"  # noqa: E501
            )

        # MariaDB's Sequence engine: seq_1_to_N is a virtual table of 1..N.
        series = f"(SELECT seq AS n FROM seq_1_to_{n} WHERE seq BETWEEN %s AND %s) g"
        task_id, json_cast, true, false = f"MD5({g})", "", "1", "0"
    else:  # sqlite

        def text(expr: str) -> str:
            return f"CAST({expr} AS TEXT)"

        def at(offset_ms: int) -> str:
            return f"strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '+' || (({g} * 600 + {offset_ms}) / 1000.0) || ' seconds')"  # noqa: E501

        series = (
            "(WITH RECURSIVE s(n) AS (SELECT %s UNION ALL SELECT n + 1 FROM s WHERE n < %s) "
            "SELECT n FROM s) g"
        )
        task_id, json_cast, true, false = f"printf('%%032x', {g} * 2654435761)", "", "1", "0"

    def concat(*parts: str) -> str:
        return f"CONCAT({', '.join(parts)})" if vendor == "mysql" else " || ".join(parts)

    status = _status_case(g)
    queue = (
        f"CASE WHEN MOD({g}, 10) < 7 THEN 'default' WHEN MOD({g}, 10) < 9 THEN 'emails' "
        "ELSE 'reports' END"
    )
    waiting = f"({status}) IN ('CREATED', 'PENDING')"
    terminal = f"({status}) NOT IN ('CREATED', 'PENDING')"
    error = (
        '\'Traceback (most recent call last):\n  File "tasks.py", line 1, in run\n'
        "ValueError: boom'"
    )
    columns = (
        "task_id, task_name, status, queue, priority, parameter, result, attempts, "
        "budget_attempts, retry_limit, retry_interval, retry_backoff, max_duration_millis, "
        "created_at, run_at, deadline_at, started_at, finished_at, last_error, worker_id, "
        "cancel_requested, available, lease_token, lease_expires_at"
    )
    values = [
        task_id,
        concat("'bench.task_'", text(f"MOD({g}, 7)")),
        status,
        queue,
        "0",
        f"({concat(QUOTED_PARAMETER, text(g), QUOTED_CLOSE)}){json_cast}",
        f"CASE WHEN ({status}) = 'COMPLETED' THEN "
        f"({concat(QUOTED_RESULT, text(g), QUOTED_CLOSE)})"
        f"{json_cast} END",
        f"CASE WHEN {terminal} THEN 1 ELSE 0 END",
        f"CASE WHEN {terminal} THEN 1 ELSE 0 END",
        "0",
        "2000",
        "'fixed'",
        "NULL",
        at(0),
        at(0),
        "NULL",
        f"CASE WHEN {terminal} THEN {at(100)} END",
        f"CASE WHEN {terminal} THEN {at(350)} END",
        f"CASE WHEN ({status}) IN ('FAILED', 'ERROR') THEN {error} END",
        f"CASE WHEN {terminal} THEN 'bench-worker' END",
        false,
        f"CASE WHEN {waiting} THEN {true} ELSE {false} END",
        "0",
        "NULL",
    ]
    return f"INSERT INTO {table} ({columns}) SELECT {', '.join(values)} FROM {series}"


def fill_database(alias: str, n: int) -> None:
    from django.db import connections

    connection = connections[alias]
    vendor = connection.vendor
    table = connection.ops.quote_name("reliable_executor_task")
    sql = _fill_sql(vendor, table, n)
    base = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=n * 0.6)).replace(
        microsecond=0, tzinfo=None
    )
    base_param: Any = base.strftime("%Y-%m-%d %H:%M:%S")
    if vendor == "postgresql":
        base_param = base.replace(tzinfo=dt.timezone.utc)
    times = sql.count("%s") - 2
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for first in range(1, n + 1, CHUNK):
            last = min(first + CHUNK - 1, n)
            cursor.execute(sql, [*([base_param] * times), first, last])
            log(f"filled {last}/{n} ({time.perf_counter() - started:.0f} s)")
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(f"VACUUM ANALYZE {table}")
        elif vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")


def fill_retry_counts(alias: str) -> None:
    """Automatic retries in each minute of the last two hours (the chart's retried series)."""
    from django_reliable_executor.core.minute_counts import epoch_minute
    from django_reliable_executor.models import ReliableRetryCount

    now = epoch_minute(dt.datetime.now(dt.timezone.utc))
    counts = ReliableRetryCount.objects.using(alias)
    counts.all().delete()
    counts.bulk_create(
        ReliableRetryCount(minute=minute, retried=minute % 7) for minute in range(now - 120, now)
    )


# -- filling Redis -----------------------------------------------------------------------------
def fill_redis(n: int, batch: int = 5000) -> None:
    from django_reliable_executor import executor
    from django_reliable_executor.core.records import NewTask

    storage = executor.storage
    base = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=n * 0.6)
    started = time.perf_counter()
    for first in range(0, n, batch):
        tasks = []
        for i in range(first, min(first + batch, n)):
            created = base + dt.timedelta(seconds=i * 0.6)
            tasks.append(
                NewTask(
                    task_id=f"{i * 2654435761:032x}",
                    task_name=TASK_NAMES[i % 7],
                    queue=QUEUES[i % 10],
                    priority=0,
                    parameter={"order_id": i},
                    retry_limit=1,
                    retry_interval=2000,
                    retry_backoff="fixed",
                    max_duration_millis=None,
                    created_at=created,
                    run_at=created,
                    deadline_at=None,
                )
            )
        # Straight to the storage: the service would stamp every task "now".
        storage.enqueue(tasks)
        if (first // batch) % 20 == 0:
            log(f"submitted {min(first + batch, n)}/{n} ({time.perf_counter() - started:.0f} s)")
    # The oldest 94 % run to an end through the storage's transitions (as a worker would);
    # the newest stay CREATED.
    to_finish = n * 94 // 100
    done = 0
    error = 'Traceback (most recent call last):\n  File "tasks.py", line 1\nValueError: boom'
    while done < to_finish:
        claims = storage.claim(
            "bench-worker", ["default", "emails", "reports"], min(1000, to_finish - done), 600
        )
        if not claims:
            break
        started_claims = [c for c in storage.start_many(claims, 600) if c is not None]
        outcomes = []
        for index, claim in enumerate(started_claims):
            share = (done + index) % 100
            if share < 88:
                outcomes.append((claim, {"charged": done + index}))
            elif share < 94:
                storage.fail(claim, error, retryable=False)
            elif share < 96:
                storage.fail(claim, error, retryable=False, is_error=True)
            else:
                storage.fail(claim, error, retryable=True)  # PENDING, retried later
        storage.complete_many(outcomes)
        done += len(claims)
        if (done // 1000) % 50 == 0:
            log(f"finished {done}/{to_finish} ({time.perf_counter() - started:.0f} s)")


# -- timing ------------------------------------------------------------------------------------
def timed(call: Callable[[], Any], rounds: int) -> dict[str, float]:
    samples = []
    for _ in range(rounds + 1):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return {"cold_ms": round(samples[0], 2), "median_ms": round(statistics.median(samples[1:]), 2)}


def page_caller(path: str) -> Callable[[], Any]:
    """Render an admin page through its view, as a superuser (no session or user row needed)."""
    from django.contrib.auth.models import AnonymousUser
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.test import RequestFactory
    from django.urls import resolve

    class Operator(AnonymousUser):
        is_active = True
        is_staff = True
        is_superuser = True
        username = "bench"

        @property
        def is_authenticated(self) -> bool:  # type: ignore[override]
            return True

        @property
        def is_anonymous(self) -> bool:  # type: ignore[override]
            return False

        def has_perm(self, perm: str, obj: Any = None) -> bool:
            return True

        def has_perms(self, perm_list: Any, obj: Any = None) -> bool:
            return True

        def has_module_perms(self, module: str) -> bool:
            return True

        def get_username(self) -> str:
            return "bench"

    factory = RequestFactory()

    def call() -> Any:
        request = factory.get(path)
        request.user = Operator()
        request._messages = CookieStorage(request)  # type: ignore[attr-defined]
        match = resolve(request.path_info)
        response = match.func(request, *match.args, **match.kwargs)
        if hasattr(response, "render"):
            response.render()
        if response.status_code != 200:
            raise RuntimeError(f"{path}: HTTP {response.status_code}")
        return response

    return call


def measure(rounds: int) -> dict[str, Any]:
    from django.contrib.admin.utils import quote
    from django.urls import reverse

    from django_reliable_executor import executor

    first = executor.list_tasks(limit=1)
    some_id = first[0].task_id
    calls: dict[str, Callable[[], Any]] = {
        "list_first_page": lambda: executor.list_tasks(limit=101),
        "list_status_failed": lambda: executor.list_tasks(status="FAILED", limit=101),
        "list_queue_reports": lambda: executor.list_tasks(queue="reports", limit=101),
        "list_task_name": lambda: executor.list_tasks(task_name="bench.task_3", limit=101),
        "list_page_50": lambda: executor.list_tasks(limit=101, offset=4900),
        "count_by_queue": executor.count_by_queue,
        "oldest_due_at": executor.oldest_due_at,
        "oldest_due_by_queue": executor.oldest_due_by_queue,
        "throughput": executor.throughput,
        "master": executor.master,
        "workers": executor.workers,
        "get_task": lambda: executor.get_task(some_id),
    }
    results: dict[str, Any] = {}
    for name, call in calls.items():
        results[name] = timed(call, rounds)
        log(f"{name}: {results[name]}")
    changelist = reverse("admin:django_reliable_executor_reliabletask_changelist")
    pages = {
        "page_list": changelist,
        "page_list_failed": changelist + "?status=FAILED",
        "page_list_page_50": changelist + "?page=50",
        "page_detail": reverse(
            "admin:django_reliable_executor_reliabletask_change", args=[quote(some_id)]
        ),
    }
    for name, path in pages.items():
        results[name] = timed(page_caller(path), rounds)
        log(f"{name}: {results[name]}")
    # The list page again, recounting every time (the admin reuses slow counts for 10 s).
    from django_reliable_executor.admin import ReliableTaskAdmin

    render = page_caller(changelist)

    def fresh() -> Any:
        ReliableTaskAdmin.counts_cache.forget()
        return render()

    results["page_list_recounted"] = timed(fresh, rounds)
    log(f"page_list_recounted: {results['page_list_recounted']}")
    return results


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    throughput.add_store_arguments(parser, DEFAULT_NAME)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per figure")
    parser.add_argument("--refill", action="store_true", help="empty and fill even if full")
    args = parser.parse_args(argv)
    args.poll_interval = None
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    store = throughput.open_store(args)
    from django_reliable_executor import executor

    log(f"store: {store.describe()}")
    total = sum(executor.count_by_status().values())
    if total != args.n or args.refill:
        log(f"store holds {total} tasks; filling it with {args.n}")
        store.clear()
        started = time.perf_counter()
        if isinstance(store, throughput.DatabaseStore):
            fill_database(store.alias, args.n)
        else:
            fill_redis(args.n)
        log(f"filled in {time.perf_counter() - started:.0f} s")
    if isinstance(store, throughput.DatabaseStore):
        fill_retry_counts(store.alias)  # for the chart's hour, whenever the store was filled
    rtt = store.rtt_ms(args.rtt_rounds)
    counts = {str(k): v for k, v in executor.count_by_status().items() if v}
    log(f"round trip {rtt:.3f} ms; tasks by status: {counts}")
    result: dict[str, Any] = {
        "storage": store.name,
        "n": sum(counts.values()),
        "rtt_ms": round(rtt, 3),
        **measure(args.rounds),
    }
    store.close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
