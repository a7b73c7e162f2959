#!/usr/bin/env python
"""Batches: the fan-in latency (last member's end -> callback's start) and a large submit.

    python bench/workflows_batches.py --storage {sqlite,mariadb,postgres,redis}

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_batches``):

1. ``submit``: one batch of ``--submit-n`` ``demo.noop`` members (default 100 000) submitted
   with ``executor.submit_batch`` and no worker running: the seconds it takes and, with
   ``--trace-memory``, the peak of Python's allocations during it (tracemalloc, a second run:
   tracing slows the submit several times).
2. ``fan_in``: one ``runexecutor`` process (``--threads`` pool threads) runs ``--batches``
   batches of ``--members`` ``demo.noop`` members, one batch after the other, each with an
   ``on_complete`` callback (``demo.noop``). Per batch, the milliseconds from the latest
   ``finished_at`` of its members (the write that submitted the callback) to the callback's
   ``started_at``: p50 and p95. Both times are the worker's own clock.

Targets at default settings: fan-in p95 <= 50 ms on Redis, <= 200 ms on PostgreSQL. Prints one
JSON line; progress and the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

TARGET_P95_MS = {"redis": 50.0, "postgres": 200.0}


def log(message: str) -> None:
    throughput.log(message)


def clear(store: throughput.Store) -> None:
    """Every task and batch of the benchmark's store gone."""
    store.clear()
    from django_reliable_executor import executor
    from django_reliable_executor.models import ReliableBatch

    alias = getattr(executor.storage, "alias", None)
    if alias is not None:
        ReliableBatch.objects.using(alias).all().delete()


def index_bytes_per_member(batch_id: str, n: int) -> float | None:
    """On Redis, the bytes the batch's member index (``bm:<id>:LIVE``, every member unfinished)
    takes per member: MEMORY USAGE with every entry sampled. None on a database."""
    from django_reliable_executor import executor

    client = getattr(executor.storage, "client", None)
    if client is None:
        return None
    key = f"{executor.storage.p}bm:{batch_id}:LIVE"
    used = client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0")
    return int(used) / n


def submit_large(store: throughput.Store, n: int, trace: bool) -> tuple[float, int | None]:
    """Seconds to submit a batch of ``n`` members; the peak traced bytes when ``trace``. On
    Redis, logs the member index's bytes per member too."""
    from django_reliable_executor import TaskSubmitRequest, executor

    clear(store)
    requests = [TaskSubmitRequest("demo.noop") for _ in range(n)]
    if trace:
        tracemalloc.start()
    began = time.perf_counter()
    try:
        info = executor.submit_batch(requests, on_complete=TaskSubmitRequest("demo.noop"))
        seconds = time.perf_counter() - began
        peak = tracemalloc.get_traced_memory()[1] if trace else None
    finally:
        if trace:
            tracemalloc.stop()
    if info.total != n:
        raise throughput.BenchError(f"the batch holds {info.total} members, not {n}")
    log(f"submit_batch of {n}: {seconds:.2f}s" + (f", peak {peak / 2**20:.1f} MiB" if peak else ""))
    per_member = index_bytes_per_member(info.batch_id, n)
    if per_member is not None:
        log(f"member index: {per_member:.1f} bytes per member (ids of 32 hex digits)")
    return seconds, peak


def fan_in(store: throughput.Store, args: argparse.Namespace) -> list[float]:
    """Per batch, ms from its last member's end to its callback's start."""
    from django_reliable_executor import TaskStatus, TaskSubmitRequest, executor

    clear(store)
    worker = throughput.WorkerProcess(
        argparse.Namespace(threads=args.threads, count_queries=None), dict(os.environ)
    )
    latencies: list[float] = []
    try:
        worker.start()
        for b in range(args.batches):
            ids = [f"b{b}-m{i}" for i in range(args.members)]
            executor.submit_batch(
                [TaskSubmitRequest("demo.noop", task_id=task_id) for task_id in ids],
                batch_id=f"b{b}",
                on_complete=TaskSubmitRequest("demo.noop", task_id=f"b{b}-done"),
            )
            began = time.monotonic()
            while True:
                callback = executor.get_task(f"b{b}-done")
                if callback is not None and callback.status is TaskStatus.COMPLETED:
                    break
                if time.monotonic() - began > args.stall_timeout:
                    raise throughput.BenchError(f"batch b{b}'s callback did not run")
                worker.check_alive()
                time.sleep(0.02)
            members = executor.storage.get_many(ids).values()
            last = max(m.finished_at for m in members if m.finished_at is not None)
            assert callback.started_at is not None
            latencies.append((callback.started_at - last).total_seconds() * 1000)
            time.sleep(args.pause)  # the worker idle again, as between real batches
    finally:
        worker.stop()
    return latencies


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_batches")
    parser.add_argument("--batches", type=int, default=40, help="fan-in batches (default 40)")
    parser.add_argument("--members", type=int, default=50, help="members each (default 50)")
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads (default 8)")
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between batches")
    parser.add_argument("--submit-n", type=int, default=100_000, help="0: skip the submit")
    parser.add_argument("--trace-memory", action="store_true", help="measure the submit's peak")
    parser.add_argument("--stall-timeout", type=float, default=60.0)
    parser.add_argument("--poll-interval", type=float, default=None)
    args = parser.parse_args(argv)
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result: dict[str, Any] = {}
    try:
        with throughput.terminate_on_sigterm():
            store = throughput.open_store(args)
            log(f"store: {store.describe()}; code: {throughput.code_version()}")
            load_before = throughput.machine_load()
            log(load_before)
            try:
                if args.submit_n:
                    seconds, _ = submit_large(store, args.submit_n, trace=False)
                    result["submit_n"] = args.submit_n
                    result["submit_s"] = round(seconds, 2)
                    if args.trace_memory:
                        _, peak = submit_large(store, args.submit_n, trace=True)
                        result["submit_peak_mib"] = round((peak or 0) / 2**20, 1)
                latencies = fan_in(store, args)
                clear(store)
            finally:
                store.close()
            load_after = throughput.machine_load()
            log(load_after)
    except throughput.BenchError as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(
        json.dumps(
            {
                "storage": store.name,
                **result,
                "batches": args.batches,
                "members": args.members,
                "threads": args.threads,
                "fan_in_p50_ms": round(statistics.median(latencies), 1),
                "fan_in_p95_ms": round(percentile(latencies, 0.95), 1),
                "fan_in_max_ms": round(max(latencies), 1),
                "target_p95_ms": TARGET_P95_MS.get(store.name),
                "load": [load_before, load_after],
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
