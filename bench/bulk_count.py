#!/usr/bin/env python
"""How long the admin's bulk action confirmation takes to count a filter's tasks.

    python bench/bulk_count.py --storage {sqlite,mariadb,postgres,redis} [--tasks 60000]

Fills a store of its own (database or key prefix ``reliable_executor_bulk_count_bench``) with
``--tasks`` tasks as bench/admin_search.py does (seven task names, three queues, 85 %
COMPLETED, 5 % FAILED, ..., a parameter ``{"customer_id": g % 10000, "order_id": g}``, the
tasks of the customers ending in 42 tagged ``import``), then times, for each filter, the count
of the storage (``bulk_actions.count_up_to``: ``count_tasks``, one pass, capped at COUNT_CAP)
beside the count it replaced (pages of ``list_tasks`` of 1,000 at growing offsets, "paged").
Each figure is the median of ``--rounds`` runs after one warm-up run, in milliseconds; the
table goes to stdout. The store is emptied and dropped afterwards unless ``--keep`` is given.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import admin_search  # noqa: E402 - its fill (names, statuses, parameter, tag)
import throughput  # noqa: E402 - the stores of the throughput benchmark, reused

DEFAULT_NAME = "reliable_executor_bulk_count_bench"
PAGE = 1000  # the replaced count's page
# (filter, count_tasks ms, its count in words, paged ms, paged count)
Row = tuple[str, float, str, float | None, int | None]
EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)  # a ``since`` before every task


def paged_count(executor: Any, filters: dict[str, Any], since: dt.datetime | None) -> int:
    """The count before ``count_tasks``: pages of ``list_tasks`` at growing offsets."""
    total, offset = 0, 0
    while True:
        page = executor.list_tasks(**filters, limit=PAGE, offset=offset)
        for task in page:
            if since is not None and task.created_at < since:
                return total
            total += 1
        if len(page) < PAGE:
            return total
        offset += len(page)


def cases() -> dict[str, tuple[dict[str, Any], dt.datetime | None]]:
    """The filters counted (and a ``since``, which takes the counters out), by label."""
    return {
        "task_name=bench.task_0": ({"task_name": "bench.task_0"}, None),
        "dead letters, task_name=bench.task_0": (
            {"statuses": ["ERROR", "FAILED", "TIMEOUT"], "task_name": "bench.task_0"},
            None,
        ),
        "every task, since 2000-01-01": ({}, EPOCH),
        f"tag={admin_search.TAG}": ({"tag": admin_search.TAG}, None),
        "customer_id=42": ({"parameter": admin_search.WANTED}, None),
    }


def measure(rounds: int, paged: bool) -> list[Row]:
    from django_reliable_executor import executor
    from django_reliable_executor.service.bulk_actions import count_up_to

    rows = []
    for label, (filters, since) in cases().items():
        millis, count = admin_search.timed(
            lambda f=filters, s=since: count_up_to(executor, f, s, None), rounds
        )
        before, old = None, None
        if paged:
            before, old = admin_search.timed(
                lambda f=filters, s=since: paged_count(executor, f, s), rounds
            )
        rows.append((label, millis, count.words(), before, old))
        extra = "" if before is None else f"; paged {before:.1f} ms ({old:,})"
        throughput.log(f"{label}: {millis:.1f} ms ({count.words()}){extra}")
    return rows


def table(storage: str, n: int, rows: list[Row]) -> str:
    lines = [
        f"{storage}, {n:,} tasks: counting a filter, median ms ({throughput.machine_load()})",
        "",
        "| filter | count_tasks ms | count | paged ms (before) | paged count |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, millis, words, before, old in rows:
        was = "" if before is None else f"{before:.1f}"
        found = "" if old is None else f"{old:,}"
        lines.append(f"| {label} | {millis:.1f} | {words} | {was} | {found} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    throughput.add_store_arguments(parser, DEFAULT_NAME)
    parser.add_argument("--tasks", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per figure")
    parser.add_argument("--no-paged", action="store_true", help="skip the replaced count")
    parser.add_argument("--keep", action="store_true", help="keep the filled store afterwards")
    args = parser.parse_args(argv)
    args.poll_interval = None
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    store = throughput.open_store(args)
    from django_reliable_executor import executor

    throughput.log(f"store: {store.describe()}")
    if sum(executor.count_by_status().values()) != args.tasks:
        store.clear()
        admin_search.clear_tags(store)
        if isinstance(store, throughput.DatabaseStore):
            admin_search.fill_database(store.alias, args.tasks)
        else:
            admin_search.fill_redis(args.tasks)
    rows = measure(args.rounds, not args.no_paged)
    print(table(store.name, args.tasks, rows))
    if not args.keep:
        admin_search.clear_tags(store)
        admin_search.drop(store)
    return 0


if __name__ == "__main__":
    sys.exit(main())
