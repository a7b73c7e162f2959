#!/usr/bin/env python
"""Async handlers on the worker's event loop: N tasks that each ``await asyncio.sleep(1)``.

    python bench/async_sleep.py --storage {sqlite,mariadb,postgres,redis} [--n 1000]

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_async``),
for each ``--async-concurrency`` value (default ``1000,100``): empties the store, submits N
``demo.async_sleep`` tasks (``{"seconds": --sleep}``) with ``submit_many``, starts ONE
``runexecutor --core-pool-size 4 --max-pool-size 4 --async-concurrency C`` and times from its
ready line to the ``finished_at`` of the last task (all COMPLETED), then stops it.

The targets (issue: async handlers on one event loop), on one worker with 4 threads:
1,000 tasks in <= 3 s at ``--async-concurrency 1000`` and <= 12 s at the default 100.

Prints exactly one JSON line on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

TASK_NAME = "demo.async_sleep"
THREADS = 4
TARGETS_S = {1000: 3.0, 100: 12.0}  # for n=1000, sleep=1


def log(message: str) -> None:
    throughput.log(message)


def drain(store: throughput.Store, args: argparse.Namespace, concurrency: int) -> dict[str, Any]:
    """Submit N sleeping tasks, run one worker over them; seconds from ready to last finish."""
    from django_reliable_executor import TaskSubmitRequest, executor

    store.clear()
    for start in range(0, args.n, 1000):
        size = min(1000, args.n - start)
        executor.submit_many(
            [TaskSubmitRequest(TASK_NAME, {"seconds": args.sleep}) for _ in range(size)]
        )
    store.after_load()
    worker_args = argparse.Namespace(threads=THREADS, count_queries=None)
    worker = throughput.WorkerProcess(worker_args, dict(os.environ))
    worker.command += ["--async-concurrency", str(concurrency)]
    try:
        ready = worker.start()
        observed = throughput.wait_until_finished(
            store, worker, args.n, stall_timeout=args.stall_timeout, interval=0.02
        )
    finally:
        worker.stop()
    counts = store.status_counts()
    if counts.get("COMPLETED", 0) != args.n:
        raise throughput.BenchError(f"expected {args.n} COMPLETED tasks, found {counts}")
    window = store.drain_window()
    end = observed if window is None else window[1].timestamp()
    seconds = end - ready
    lower_bound = args.sleep * -(-args.n // concurrency)  # rounds of sleeps, at the least
    log(
        f"async concurrency {concurrency}: {args.n} tasks of {args.sleep:g} s in {seconds:.2f}s "
        f"from the worker's ready line (at least {lower_bound:g}s: {args.n} / {concurrency} "
        "rounds of sleep)"
    )
    return {"async_concurrency": concurrency, "seconds": round(seconds, 2)}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_async")
    parser.add_argument("--n", type=int, default=1000, help="tasks per run (default 1000)")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each task awaits")
    parser.add_argument(
        "--async-concurrency",
        default="1000,100",
        help="comma-separated --async-concurrency values, one run each (default 1000,100)",
    )
    parser.add_argument("--stall-timeout", type=float, default=60.0)
    parser.add_argument("--poll-interval", type=float, default=None)
    args = parser.parse_args(argv)
    args.conn_max_age = None
    args.concurrencies = [int(value) for value in args.async_concurrency.split(",") if value]
    if args.n < 1 or not args.concurrencies or min(args.concurrencies) < 1:
        parser.error("--n and every --async-concurrency must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with throughput.terminate_on_sigterm():
            store = throughput.open_store(args)
            log(f"store: {store.describe()}; code: {throughput.code_version()}")
            log(throughput.machine_load())
            runs = []
            try:
                for concurrency in args.concurrencies:
                    runs.append(drain(store, args, concurrency))
                    time.sleep(0.5)
            finally:
                store.close()
    except throughput.BenchError as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    for run in runs:
        if args.n == 1000 and args.sleep == 1.0 and run["async_concurrency"] in TARGETS_S:
            run["target_s"] = TARGETS_S[run["async_concurrency"]]
    result = {"storage": store.name, "n": args.n, "sleep_s": args.sleep, "threads": THREADS}
    print(json.dumps({**result, "runs": runs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
