#!/usr/bin/env python
"""How fast the admin's parameter search answers its first page with 1,000,000 tasks stored.

    python bench/admin_search.py --storage {sqlite,mariadb,postgres,redis} [--tasks 1000000]

Fills a store of its own (database or key prefix ``reliable_executor_search_bench``) with
``--tasks`` tasks whose parameter is ``{"customer_id": g % 10000, "order_id": g}``: one task in
10 000 has ``customer_id`` 42, a selective filter. The customers whose id ends in 42
(``customer_id % 100 == 42``, 1 % of the tasks, every task of customer 42 among them) are
tagged ``import``. Then times the admin's first page (``list_tasks(limit=101)``: its 100 rows
and one more to know whether a next page follows) of ``parameter={"customer_id": 42}`` alone
and with a status, a task name and the tag, beside the same page without the parameter, and
the admin's task list page rendered with the search. Each figure is the median of
``--rounds`` runs after one warm-up run, in milliseconds; the table goes to stdout.

``--searchable customer_id`` times the parameter searches again under SEARCHABLE_PARAMETERS
naming that key (rows labelled "[indexed]"), the parameter index of a database store filled
first by one ``INSERT ... SELECT`` when it holds none (``--indexed-only``: those rows only).

Filling: on a database one ``INSERT ... SELECT`` over a generated series per 100 000 rows (the
rows of bench/admin_list.py: 85 % COMPLETED, 5 % FAILED, 4 % CREATED, 2 % PENDING, the rest
CANCELLED/TIMEOUT/ERROR, seven task names, three queues), then the tag's rows. On Redis the tasks
go straight to the storage's ``enqueue`` in chunks of 5 000 and the oldest 94 % through its
claim/start/complete/fail transitions, as bench/admin_list.py does. The store is emptied and
dropped afterwards unless ``--keep`` is given (a kept store is reused when it holds exactly
``--tasks`` tasks).
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
from urllib.parse import urlencode

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import admin_list  # noqa: E402 - its database fill, with this benchmark's parameter
import throughput  # noqa: E402 - the stores of the throughput benchmark, reused

DEFAULT_NAME = "reliable_executor_search_bench"
CUSTOMERS = 10_000  # customer_id = g % CUSTOMERS: customer 42 owns one task in 10 000
WANTED = {"customer_id": 42}
TAG = "import"  # the tasks of the customers whose id ends in 42 (1 %)
PAGE = 101  # the admin's page: 100 rows and one more (task_pages.PAGE_SIZE + 1)
REDIS_CHUNK = 5000


def log(message: str) -> None:
    throughput.log(message)


# -- filling a database ------------------------------------------------------------------------
def parameter_sql(vendor: str) -> str:
    """admin_list's parameter expression opens with this: ``{"customer_id": g % 10000, "order_id":``
    (it goes on with g and the closing brace)."""
    if vendor == "mysql":  # one more argument of its CONCAT(...)
        return f"""'{{"customer_id": ', MOD(g.n, {CUSTOMERS}), ', "order_id": '"""
    if vendor == "postgresql":
        return f"""'{{"customer_id": ' || MOD(g.n, {CUSTOMERS}) || ', "order_id": '"""
    # SQLite's MOD() answers a real number (42.0), its % operator an integer.
    return f"""'{{"customer_id": ' || (g.n % {CUSTOMERS}) || ', "order_id": '"""


def tag_sql(vendor: str, task: str, tag_table: str) -> list[str]:
    """The tag's index rows and the tasks' ``tags``, for the customers whose id ends in 42."""
    customer = {
        "postgresql": "(parameter->>'customer_id')::int",
        "mysql": "JSON_VALUE(parameter, '$.customer_id')",
        "sqlite": "json_extract(parameter, '$.customer_id')",
    }[vendor]
    return [
        f"INSERT INTO {tag_table} (tag, task_id) SELECT '{TAG}', task_id FROM {task} "
        f"WHERE MOD({customer}, 100) = 42",
        f"UPDATE {task} SET tags = '[\"{TAG}\"]' "
        f"WHERE task_id IN (SELECT task_id FROM {tag_table})",
    ]


def index_sql(vendor: str, task: str, param_table: str) -> str:
    """The parameter index's rows of ``customer_id`` (its canonical text: the integer), as
    ``executor index-parameters`` would write them, for a store filled without them."""
    customer = {
        "postgresql": "parameter->>'customer_id'",
        "mysql": "JSON_VALUE(parameter, '$.customer_id')",
        "sqlite": "CAST(json_extract(parameter, '$.customer_id') AS TEXT)",
    }[vendor]
    key = "`key`" if vendor == "mysql" else '"key"'
    return (
        f"INSERT INTO {param_table} ({key}, value, task_id) "
        f"SELECT 'customer_id', {customer}, task_id FROM {task}"
    )


def fill_index(alias: str) -> None:
    """The index rows of ``customer_id`` for every task, unless there are some already."""
    from django.db import connections

    from django_reliable_executor.models import ReliableTaskParameter

    rows = ReliableTaskParameter.objects.using(alias)
    if rows.filter(key="customer_id").exists():
        return
    connection = connections[alias]
    quote = connection.ops.quote_name
    started = time.perf_counter()
    table = quote("reliable_executor_task_param")
    with connection.cursor() as cursor:
        cursor.execute(index_sql(connection.vendor, quote("reliable_executor_task"), table))
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {table}")
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")
    log(f"indexed customer_id in {time.perf_counter() - started:.0f} s")


def fill_database(alias: str, n: int) -> None:
    from django.db import connections

    connection = connections[alias]
    admin_list.QUOTED_PARAMETER = parameter_sql(connection.vendor)
    admin_list.fill_database(alias, n)
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            # admin_list's names end in ".0" there (SQLite's MOD() is real): drop it.
            cursor.execute(
                f"UPDATE {quote('reliable_executor_task')} "
                "SET task_name = substr(task_name, 1, length(task_name) - 2)"
            )
        for sql in tag_sql(
            connection.vendor,
            quote("reliable_executor_task"),
            quote("reliable_executor_task_tag"),
        ):
            cursor.execute(sql)
        # Fresh statistics of the tag table (the planner saw it empty), as autovacuum would.
        table = quote("reliable_executor_task_tag")
        if connection.vendor == "postgresql":
            cursor.execute(f"ANALYZE {table}")
        elif connection.vendor == "mysql":
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()
        else:
            cursor.execute("ANALYZE")
    log("tagged")


# -- filling Redis -----------------------------------------------------------------------------
def new_tasks(
    first: int, last: int, base: dt.datetime, searchable: Sequence[str] = ()
) -> list[Any]:
    """Tasks ``first`` to ``last``; with ``searchable``, with their parameter index entries
    of those keys (as a submit under SEARCHABLE_PARAMETERS stores them)."""
    from django_reliable_executor.core.parameter_index import index_entries
    from django_reliable_executor.core.records import NewTask

    tasks = []
    for i in range(first, last):
        created = base + dt.timedelta(seconds=i * 0.6)
        customer = i % CUSTOMERS
        parameter = {"customer_id": customer, "order_id": i}
        tasks.append(
            NewTask(
                task_id=f"{i * 2654435761:032x}",
                task_name=admin_list.TASK_NAMES[i % 7],
                queue=admin_list.QUEUES[i % 10],
                priority=0,
                parameter=parameter,
                retry_limit=1,
                retry_interval=2000,
                retry_backoff="fixed",
                max_duration_millis=None,
                created_at=created,
                run_at=created,
                deadline_at=None,
                tags=(TAG,) if customer % 100 == 42 else (),
                indexed=index_entries(parameter, searchable),
            )
        )
    return tasks


def fill_redis(n: int, searchable: Sequence[str] = ()) -> float:
    """Fill Redis with ``n`` tasks (with ``searchable``: their parameter index entries too);
    the bytes of Redis memory (INFO used_memory) they took per task."""
    from django_reliable_executor import executor

    storage = executor.storage
    memory = storage.client.info("memory")["used_memory"]
    base = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=n * 0.6)
    started = time.perf_counter()
    for first in range(0, n, REDIS_CHUNK):
        # Straight to the storage: the service would stamp every task "now".
        storage.enqueue(new_tasks(first, min(first + REDIS_CHUNK, n), base, searchable))
        if (first // REDIS_CHUNK) % 20 == 0:
            seconds = time.perf_counter() - started
            log(f"enqueued {min(first + REDIS_CHUNK, n)}/{n} ({seconds:.0f} s)")
    finish_redis(storage, n * 94 // 100, started)
    per_task = (storage.client.info("memory")["used_memory"] - memory) / n
    log(f"Redis memory: {per_task:.0f} bytes per task")
    return per_task


def redis_indexed(keys: Sequence[str]) -> bool:
    """Whether the Redis store holds parameter index sets of each of ``keys`` (was filled
    with them)."""
    from django_reliable_executor import executor
    from django_reliable_executor.storage.redis.parameter_index import entry_key

    storage = executor.storage
    return all(
        any(
            any(storage.client.scan_iter(match=entry_key(prefix, key, "*"), count=10_000))
            for prefix in storage.prefixes
        )
        for key in keys
    )


def finish_redis(storage: Any, to_finish: int, started: float) -> None:
    """The oldest ``to_finish`` tasks to an end through the storage's transitions."""
    done = 0
    error = "ValueError: boom"
    while done < to_finish:
        claims = storage.claim(
            "bench-worker", ["default", "emails", "reports"], min(1000, to_finish - done), 600
        )
        if not claims:
            break
        running = [c for c in storage.start_many(claims, 600) if c is not None]
        outcomes = []
        for index, claim in enumerate(running):
            if (done + index) % 100 < 90:
                outcomes.append((claim, None))
            else:
                storage.fail(claim, error, retryable=False)
        storage.complete_many(outcomes)
        done += len(claims)
        if (done // 1000) % 100 == 0:
            log(f"finished {done}/{to_finish} ({time.perf_counter() - started:.0f} s)")


# -- timing ------------------------------------------------------------------------------------
def timed(call: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    """The median milliseconds of ``rounds`` calls after a warm-up one, and the last answer."""
    answer = call()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        answer = call()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), answer


def cases() -> dict[str, dict[str, Any]]:
    """The list_tasks filters timed, by the table's row label."""
    return {
        "no filter (for comparison)": {},
        f"tag={TAG} alone (for comparison)": {"tag": TAG},
        "customer_id=42": {"parameter": WANTED},
        "customer_id=42, status=COMPLETED": {"parameter": WANTED, "status": "COMPLETED"},
        "customer_id=42, task_name=bench.task_0": {
            "parameter": WANTED,
            "task_name": "bench.task_0",
        },
        f"customer_id=42, tag={TAG}": {"parameter": WANTED, "tag": TAG},
        "customer_id=42, status=FAILED (no match)": {"parameter": WANTED, "status": "FAILED"},
    }


def measure(rounds: int, searchable: Sequence[str] = ()) -> list[tuple[str, float, int, bool]]:
    """The table's rows; with ``searchable``, under SEARCHABLE_PARAMETERS naming those keys
    (the searches through the parameter index), each label ending in "[indexed]"."""
    from django.conf import settings
    from django.test import override_settings

    if not searchable:
        return _measure(rounds, "")
    options = {**settings.RELIABLE_EXECUTOR, "SEARCHABLE_PARAMETERS": tuple(searchable)}
    with override_settings(RELIABLE_EXECUTOR=options):
        return _measure(rounds, " [indexed]")


def _measure(rounds: int, suffix: str) -> list[tuple[str, float, int, bool]]:
    from django.urls import reverse

    from django_reliable_executor import executor
    from django_reliable_executor.core.parameter_filter import cut_short

    rows = []
    for label, filters in cases().items():
        if suffix and "parameter" not in filters:
            continue  # (the comparisons do not read the index)
        label += suffix
        millis, page = timed(lambda f=filters: executor.list_tasks(limit=PAGE, **f), rounds)
        rows.append((label, millis, len(page), cut_short(page)))
        log(
            f"{label}: {millis:.1f} ms, {len(page)} rows{' (cut short)' if cut_short(page) else ''}"
        )
    url = reverse("admin:django_reliable_executor_reliabletask_changelist")
    wanted = json.dumps(WANTED, separators=(",", ":"))
    for label, path in (
        ("admin page: no filter (for comparison)", url),
        ("admin page: customer_id=42", url + "?" + urlencode({"parameter": wanted})),
        (
            f"admin page: customer_id=42 tag:{TAG}",
            url + "?" + urlencode({"parameter": wanted, "tag": TAG}),
        ),
    ):
        if suffix and "customer_id" not in label:
            continue
        label += suffix
        millis, _ = timed(admin_list.page_caller(path), rounds)
        rows.append((label, millis, -1, False))
        log(f"{label}: {millis:.1f} ms")
    return rows


def table(storage: str, n: int, rows: list[tuple[str, float, int, bool]]) -> str:
    lines = [
        f"{storage}, {n:,} tasks: first page (limit {PAGE}), median ms",
        "",
        "| filter | ms | rows |",
        "|---|---:|---:|",
    ]
    for label, millis, found, short in rows:
        shown = "" if found < 0 else f"{found}{' (cut short)' if short else ''}"
        lines.append(f"| {label} | {millis:.1f} | {shown} |")
    return "\n".join(lines)


# -- the store ---------------------------------------------------------------------------------
def drop(store: Any) -> None:
    """Empty the benchmark's store and drop its database (its own: never another)."""
    store.clear()
    if isinstance(store, throughput.RedisStore):
        store.close()
        return
    from django.db import connections

    connection = connections[store.alias]
    if connection.vendor == "sqlite":
        connection.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(store.path) + suffix).unlink(missing_ok=True)
    elif connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {connection.ops.quote_name(store.db_name)}")
        connection.close()
    else:
        connection.close()
        with throughput.postgres_server() as server:
            server.execute(f'DROP DATABASE "{store.db_name}" WITH (FORCE)')
    log(f"dropped {store.describe() if connection.vendor == 'sqlite' else store.db_name}")


def clear_tags(store: Any) -> None:
    """The tag table too (throughput's clear leaves it: no other benchmark tags)."""
    if isinstance(store, throughput.DatabaseStore):
        from django_reliable_executor.models import ReliableTaskTag

        ReliableTaskTag.objects.using(store.alias).all().delete()
        clear_index(store)


def clear_index(store: Any) -> None:
    """The parameter index's rows (throughput's clear leaves them)."""
    if isinstance(store, throughput.DatabaseStore):
        from django_reliable_executor.models import ReliableTaskParameter

        ReliableTaskParameter.objects.using(store.alias).all().delete()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    throughput.add_store_arguments(parser, DEFAULT_NAME)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5, help="timed runs per figure")
    parser.add_argument("--keep", action="store_true", help="keep the filled store afterwards")
    parser.add_argument(
        "--searchable",
        action="append",
        default=[],
        metavar="KEY",
        help="also time the searches with SEARCHABLE_PARAMETERS naming KEY (customer_id), "
        "the parameter index filled first (database storages; on Redis the tasks are stored "
        "with their entries, the store filled anew unless it holds them)",
    )
    parser.add_argument(
        "--indexed-only", action="store_true", help="with --searchable: skip the plain searches"
    )
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
    fill_seconds = None
    on_redis = isinstance(store, throughput.RedisStore)
    if on_redis and total == args.tasks and args.searchable and not redis_indexed(args.searchable):
        total = -1  # kept without the index: filled anew with it
    memory = None
    if total != args.tasks:
        log(f"store holds {total} tasks; filling it with {args.tasks}")
        store.clear()
        clear_tags(store)
        started = time.perf_counter()
        if isinstance(store, throughput.DatabaseStore):
            fill_database(store.alias, args.tasks)
        else:
            memory = fill_redis(args.tasks, args.searchable)
        fill_seconds = time.perf_counter() - started
        log(f"filled in {fill_seconds:.0f} s")
    rows = [] if args.indexed_only and args.searchable else measure(args.rounds)
    if args.searchable:
        if isinstance(store, throughput.DatabaseStore):
            fill_index(store.alias)
        rows += measure(args.rounds, args.searchable)
    print(table(store.name, args.tasks, rows))
    if fill_seconds is not None:
        print(f"\nfilled in {fill_seconds:.0f} s")
    if memory is not None:
        indexed = f" (with the index of {', '.join(args.searchable)})" if args.searchable else ""
        print(f"Redis memory: {memory:.0f} bytes per task{indexed}")
    if not args.keep:
        clear_tags(store)
        drop(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
