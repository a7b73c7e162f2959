#!/usr/bin/env python
"""What a worker's drain costs another process's writes: submits from a second process, timed.

    python bench/side_writer.py --storage sqlite --n 10000 --every 0.01

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_side``),
each round stores N tasks, starts one ``runexecutor`` process with ``--threads`` pool threads,
and while it drains them a second process (``manage.py shell``) submits one ``demo.noop`` task
every ``--every`` seconds into a queue no worker serves, timing each submit. Scenarios,
alternated: ``unlimited`` (N ``demo.noop``) and ``limited`` (N ``demo.noop_rated``, a rate
limit far above the drain rate). Prints one JSON line: per scenario the median drain time and,
over every round, how many submits the side process made during the drains and their p50, p99
and longest time in milliseconds. On SQLite this shows whether the worker's threads, taking
turns on their writes (docs/workers.md#sqlite), leave another process's writes waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import rate_limits  # noqa: E402 - its drain helpers
import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

MANAGE = BENCH.parent / "testproject" / "manage.py"
SCENARIOS = {"unlimited": "demo.noop", "limited": "demo.noop_rated"}
SIDE_QUEUE = "side"  # nobody serves it: the side submits stay stored, untouched

# The side process: submits until the stop file appears, then prints each submit's seconds.
SIDE_CODE = """
import json, os, sys, time
from django_reliable_executor import executor
stop, every, times = sys.argv[-2], float(sys.argv[-1]), []
while not os.path.exists(stop):
    began = time.perf_counter()
    executor.submit("demo.noop", queue=%(queue)r)
    times.append(time.perf_counter() - began)
    time.sleep(max(0.0, every - times[-1]))
print(json.dumps(times))
"""


def run_round(
    store: throughput.Store, args: argparse.Namespace, scenario: str
) -> tuple[float, list[float]]:
    """Seconds of the drain, and the side process's submit times during it."""
    store.clear()
    rate_limits.clear_rate_logs()
    rate_limits.submit(SCENARIOS[scenario], args.n)
    store.after_load()
    worker = throughput.WorkerProcess(
        argparse.Namespace(threads=args.threads, count_queries=None), dict(os.environ)
    )
    stop = Path(tempfile.mkdtemp()) / "stop"
    code = SIDE_CODE % {"queue": SIDE_QUEUE}
    side: subprocess.Popen[bytes] | None = None
    try:
        ready = worker.start()
        side = subprocess.Popen(
            [sys.executable, str(MANAGE), "shell", "-c", code, str(stop), str(args.every)],
            env=dict(os.environ),
            stdout=subprocess.PIPE,
        )
        done_at = rate_limits.wait_for(
            lambda: rate_limits.completed() >= args.n, worker, args.stall_timeout
        )
        stop.touch()
        out, _ = side.communicate(timeout=60)
        if side.returncode != 0:
            raise throughput.BenchError(f"the side process exited with {side.returncode}")
    finally:
        worker.stop()
        if side is not None and side.poll() is None:
            side.kill()
        stop.unlink(missing_ok=True)
        stop.parent.rmdir()
    times = json.loads(out)
    seconds = done_at - ready
    throughput.log(
        f"{scenario}: {args.n} tasks in {seconds:.2f}s; {len(times)} side submits, "
        f"longest {max(times) * 1000:.1f} ms"
    )
    return seconds, times


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_side")
    parser.add_argument("--n", type=int, default=10_000, help="tasks per drain (default 10000)")
    parser.add_argument(
        "--every", type=float, default=0.01, help="seconds between side submits (default 0.01)"
    )
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario (default 3)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--stall-timeout", type=float, default=300.0)
    parser.add_argument("--poll-interval", type=float, default=None)
    args = parser.parse_args(argv)
    args.conn_max_age = None
    args.scenario_names = [name for name in args.scenarios.split(",") if name]
    unknown = sorted(set(args.scenario_names) - set(SCENARIOS))
    if unknown or not args.scenario_names:
        parser.error(f"--scenarios: choose among {', '.join(SCENARIOS)}, not {unknown}")
    if min(args.n, args.threads, args.rounds) < 1 or args.every <= 0:
        parser.error("--n, --threads and --rounds must be >= 1, --every > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = throughput.alternate_rounds(
        args, args.scenario_names, lambda store, name: run_round(store, args, name)
    )
    if isinstance(rounds, int):
        return rounds
    result: dict[str, Any] = {"storage": rounds.storage, "n": args.n, "every": args.every}
    for name, values in rounds.results.items():
        times = [t for _, side in values for t in side]
        result[name] = {
            "drain_s": round(statistics.median(d for d, _ in values), 2),
            "side_submits": len(times),
            "side_p50_ms": round(percentile(times, 0.5) * 1000, 2),
            "side_p99_ms": round(percentile(times, 0.99) * 1000, 2),
            "side_max_ms": round(max(times) * 1000, 2),
            "rounds": [round(d, 2) for d, _ in values],
        }
    result["load"] = rounds.load
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
