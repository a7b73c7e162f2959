#!/usr/bin/env python
"""What a large ``executor purge`` costs a drain running beside it, with and without --pause.

    python bench/purge_pacing.py --storage {sqlite,mariadb,postgres} --n 10000 --finished 200000

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_purge``),
each round first stores ``--finished`` finished tasks (``CANCELLED``, finished two hours ago,
in a queue of their own), then one ``runexecutor`` process with ``--threads`` pool threads
drains N ``demo.noop`` tasks, scenarios alternated:

1. ``quiet``: nothing else runs;
2. ``purge``: ``manage.py executor purge --older-than 1h --yes`` starts with the drain and
   deletes the finished tasks, its rounds of ``--batch-size`` back to back;
3. ``paced``: the same purge with ``--pause`` seconds between its rounds.

Each figure is the median over ``--rounds`` of the seconds from the worker's ready line until
the N tasks are done, and of how long the purge ran (it may outlast the drain). Prints one JSON
line with the ratios against ``quiet``; progress and the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import rate_limits  # noqa: E402 - its drain helpers
import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

MANAGE = BENCH.parent / "testproject" / "manage.py"
SCENARIOS = ("quiet", "purge", "paced")
ARCHIVE = "archive"  # the finished tasks' queue


def store_finished(n: int) -> None:
    """``n`` finished tasks: submitted delayed into ARCHIVE (no worker takes them), then
    marked CANCELLED two hours ago in one UPDATE."""
    from django.db import connections

    from django_reliable_executor import TaskSubmitRequest, executor

    for start in range(0, n, 1000):
        size = min(1000, n - start)
        executor.submit_many(
            [
                TaskSubmitRequest("demo.noop", queue=ARCHIVE, delay_millis=3_600_000)
                for _ in range(size)
            ]
        )
    storage = executor.storage
    finished = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=2)
    with connections[storage.alias].cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute(
            "UPDATE reliable_executor_task SET status = %s, available = %s, finished_at = %s "
            "WHERE queue = %s",
            ["CANCELLED", False, storage._dt(finished), ARCHIVE],  # type: ignore[attr-defined]
        )


def completed() -> int:
    """The drain's completed tasks (an index range: the finished backlog is CANCELLED)."""
    from django_reliable_executor.models import ReliableTask
    from django_reliable_executor.service.reliable_executor import executor

    alias = executor.storage.alias  # type: ignore[attr-defined]
    return ReliableTask.objects.using(alias).filter(status="COMPLETED").count()


def run_round(
    store: throughput.Store, args: argparse.Namespace, scenario: str
) -> tuple[float, float | None]:
    """Seconds of the drain, and of the purge beside it (None: no purge)."""
    store.clear()
    throughput.log(f"{scenario}: storing {args.finished} finished tasks")
    store_finished(args.finished)
    rate_limits.submit("demo.noop", args.n)
    store.after_load()
    worker = throughput.WorkerProcess(
        argparse.Namespace(threads=args.threads, count_queries=None), dict(os.environ)
    )
    purge: subprocess.Popen[bytes] | None = None
    purge_began = 0.0
    try:
        ready = worker.start()
        if scenario != "quiet":
            command = [sys.executable, str(MANAGE), "executor", "purge", "--older-than", "1h"]
            command += ["--yes", "--batch-size", str(args.batch_size)]
            if scenario == "paced":
                command += ["--pause", str(args.pause)]
            purge_began = time.monotonic()
            purge = subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.DEVNULL)
        done_at = rate_limits.wait_for(lambda: completed() >= args.n, worker, args.stall_timeout)
        purge_seconds = None
        if purge is not None:
            if purge.wait(timeout=args.stall_timeout) != 0:
                raise throughput.BenchError(f"the purge exited with {purge.returncode}")
            purge_seconds = time.monotonic() - purge_began
    finally:
        worker.stop()
        if purge is not None and purge.poll() is None:
            purge.kill()
    seconds = done_at - ready
    took = f", purge {purge_seconds:.2f}s" if purge_seconds is not None else ""
    throughput.log(f"{scenario}: {args.n} tasks in {seconds:.2f}s{took}")
    return seconds, purge_seconds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_purge")
    parser.add_argument("--n", type=int, default=10_000, help="tasks per drain (default 10000)")
    parser.add_argument(
        "--finished", type=int, default=200_000, help="finished tasks purged (default 200000)"
    )
    parser.add_argument("--batch-size", type=int, default=500, help="purge rounds (default 500)")
    parser.add_argument(
        "--pause", type=float, default=0.05, help="paced purge's pause (default 0.05 s)"
    )
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads (default 8)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per scenario (default 2)")
    parser.add_argument("--stall-timeout", type=float, default=600.0)
    parser.add_argument("--poll-interval", type=float, default=None)
    args = parser.parse_args(argv)
    args.conn_max_age = None
    if args.storage == "redis":
        parser.error("--storage redis: this benchmark stores its finished tasks by SQL")
    if min(args.n, args.finished, args.batch_size, args.threads, args.rounds) < 1:
        parser.error("--n, --finished, --batch-size, --threads and --rounds must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = throughput.alternate_rounds(
        args, SCENARIOS, lambda store, name: run_round(store, args, name)
    )
    if isinstance(rounds, int):
        return rounds
    drains = {name: [d for d, _ in values] for name, values in rounds.results.items()}
    purges = {name: [p for _, p in rounds.results[name] if p is not None] for name in SCENARIOS}
    medians = {name: statistics.median(values) for name, values in drains.items()}
    result: dict[str, Any] = {
        "storage": rounds.storage,
        "n": args.n,
        "finished": args.finished,
        "batch_size": args.batch_size,
        "pause": args.pause,
        **{f"{name}_s": round(value, 2) for name, value in medians.items()},
        "purge_ratio": round(medians["purge"] / medians["quiet"], 3),
        "paced_ratio": round(medians["paced"] / medians["quiet"], 3),
        **{
            f"{name}_purge_s": round(statistics.median(purges[name]), 2)
            for name in ("purge", "paced")
        },
        "rounds": {name: [round(v, 2) for v in values] for name, values in drains.items()},
        "load": rounds.load,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
