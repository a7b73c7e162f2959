#!/usr/bin/env python
"""What a rate limit costs the drain: one worker process, limited against unlimited names.

    python bench/rate_limits.py --storage {sqlite,mariadb,postgres,redis} --n 10000

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_rate``),
one ``runexecutor`` process with ``--threads`` pool threads drains, rounds alternated:

1. ``unlimited``: N ``demo.noop`` tasks (no rate limit);
2. ``limited``: N ``demo.noop_rated`` tasks (``rate_limit="100000/s"``, far above the drain
   rate: the limit is checked and logged at every claim and start, never reached);
3. ``others_behind_held``: ``--held`` ``demo.noop_hourly`` tasks (``rate_limit="1/h"``: one
   runs, the rest stay held at the limit) submitted first, in the same queue, then N
   ``demo.noop`` tasks: the seconds until every ``demo.noop`` task is done, against
   ``unlimited``'s.

Each figure is the median over ``--rounds`` of the seconds from the worker's ready line until
the tasks are done (polled every 20 ms), and of the worker process's CPU time per task over it
(``*_cpu_us``, from /proc: steadier than the times on a busy machine). Targets: ``limited``
and ``others_behind_held`` within 10 % of ``unlimited``. Prints one JSON line; progress and the
machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

TARGET_RATIO = 1.10
SCENARIOS = ("unlimited", "limited", "others_behind_held")


def log(message: str) -> None:
    throughput.log(message)


def submit(task_name: str, n: int) -> None:
    from django_reliable_executor import TaskSubmitRequest, executor

    for start in range(0, n, 1000):
        size = min(1000, n - start)
        executor.submit_many([TaskSubmitRequest(task_name) for _ in range(size)])


def completed() -> int:
    from django_reliable_executor import TaskStatus, executor

    return executor.count_by_status()[TaskStatus.COMPLETED]


def clear_rate_logs() -> None:
    """Forget every claim the rate limits counted (the task store's clear keeps the database's
    log table; on Redis the logs go with the key prefix): each round starts from an empty
    window, so the held name's one task of the hour runs again."""
    from django_reliable_executor import executor
    from django_reliable_executor.models import ReliableRateLog

    alias = getattr(executor.storage, "alias", None)
    if alias is not None:
        ReliableRateLog.objects.using(alias).all().delete()


def drain(store: throughput.Store, args: argparse.Namespace, scenario: str) -> tuple[float, float]:
    """Seconds from the worker's ready line until the scenario's N tasks are done, and the
    worker process's CPU microseconds per task meanwhile (steadier on a busy machine)."""
    store.clear()
    clear_rate_logs()
    held = 0
    if scenario == "others_behind_held":
        held = args.held
        submit("demo.noop_hourly", held)
    submit("demo.noop_rated" if scenario == "limited" else "demo.noop", args.n)
    store.after_load()
    # others_behind_held: the first held task runs (its limit's one of the hour).
    target = args.n + (1 if held else 0)
    worker = throughput.WorkerProcess(
        argparse.Namespace(threads=args.threads, count_queries=count_file(args, scenario)),
        dict(os.environ),
    )
    try:
        ready = worker.start()
        cpu_at_ready = worker.cpu_seconds()
        done_at = wait_for(lambda: completed() >= target, worker, args.stall_timeout)
        cpu_us = 1e6 * (worker.cpu_seconds() - cpu_at_ready) / args.n
    finally:
        worker.stop()
    if completed() != target:
        raise throughput.BenchError(f"{scenario}: expected {target} completed, not {completed()}")
    seconds = done_at - ready
    log(
        f"{scenario}: {args.n} tasks in {seconds:.2f}s ({args.n / seconds:.0f}/s), "
        f"worker CPU {cpu_us:.0f} us/task"
    )
    return seconds, cpu_us


def count_file(args: argparse.Namespace, scenario: str) -> str | None:
    """--count-queries: the profile file of this scenario's worker (the last round's)."""
    if args.count_queries is None:
        return None
    return f"{args.count_queries}.{scenario}.json"


def wait_for(done: Callable[[], bool], worker: throughput.WorkerProcess, stall: float) -> float:
    """Poll ``done`` every 20 ms; time.time() when it held."""
    began = time.monotonic()
    while not done():
        if time.monotonic() - began > stall:
            raise throughput.BenchError(f"not done within {stall:.0f}s")
        worker.check_alive()
        time.sleep(0.02)
    return time.time()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_rate")
    parser.add_argument("--n", type=int, default=10_000, help="tasks per drain (default 10000)")
    parser.add_argument("--held", type=int, default=1000, help="held-back backlog (default 1000)")
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario (default 3)")
    parser.add_argument("--stall-timeout", type=float, default=300.0)
    parser.add_argument("--poll-interval", type=float, default=None)
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated, of {', '.join(SCENARIOS)} (default all; ratios need unlimited)",
    )
    parser.add_argument(
        "--count-queries",
        metavar="PREFIX",
        default=None,
        help="profile: run each worker under bench/count_queries.py, writing PREFIX.SCENARIO.json "
        "(adds overhead; do not quote its times)",
    )
    args = parser.parse_args(argv)
    args.conn_max_age = None
    if min(args.n, args.held, args.threads, args.rounds) < 1:
        parser.error("--n, --held, --threads and --rounds must be >= 1")
    args.scenarios = tuple(name.strip() for name in args.scenarios.split(",") if name.strip())
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown or not args.scenarios:
        parser.error(f"--scenarios: unknown or none: {unknown}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scenarios = args.scenarios
    seconds: dict[str, list[float]] = {name: [] for name in scenarios}
    cpu: dict[str, list[float]] = {name: [] for name in scenarios}
    try:
        with throughput.terminate_on_sigterm():
            store = throughput.open_store(args)
            log(f"store: {store.describe()}; code: {throughput.code_version()}")
            load_before = throughput.machine_load()
            log(load_before)
            try:
                for _ in range(args.rounds):
                    for name in scenarios:
                        took, cpu_us = drain(store, args, name)
                        seconds[name].append(took)
                        cpu[name].append(cpu_us)
                store.clear()
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
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    base = medians.get("unlimited")
    result: dict[str, Any] = {
        "storage": store.name,
        "n": args.n,
        "held": args.held,
        "threads": args.threads,
        **{f"{name}_s": round(value, 2) for name, value in medians.items()},
        **{f"{name}_per_s": round(args.n / value) for name, value in medians.items()},
        **{
            f"{name}_ratio": round(medians[name] / base, 3)
            for name in ("limited", "others_behind_held")
            if base and name in medians
        },
        "target_ratio": TARGET_RATIO,
        **{f"{name}_cpu_us": round(statistics.median(cpu[name])) for name in scenarios},
        "rounds": {name: [round(v, 2) for v in values] for name, values in seconds.items()},
        "load": [load_before, load_after],
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
