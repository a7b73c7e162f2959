#!/usr/bin/env python
"""The debounce proof: a burst of submits of one key against a real worker, read from the
handler's own journal.

    python bench/debounce.py --storage {sqlite,mariadb,postgres,redis}
        [--submits 1000] [--seconds 60] [--debounce 10] [--max-wait 30]

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_debounce``),
one ``runexecutor`` process runs ``demo.debounced``, which writes each run's start and parameter
to a journal. This process submits ``--submits`` tasks of one ``unique_key`` evenly over
``--seconds``, each with its number as parameter, twice:

1. ``debounce``: ``debounce=--debounce``. Expected: exactly one run, with the last submit's
   parameter, starting ``--debounce`` seconds after the last submit (within POLL_INTERVAL and
   the worker's start).
2. ``max_wait``: ``debounce=--debounce, debounce_max_wait=--max-wait``. Expected: a run about
   every ``--max-wait`` seconds during the burst, and the last one ``--debounce`` after the
   last submit (or at its window's max wait, when that comes first).

A window is the submits that returned one task id: each must run once, with the parameter of
its last submit, at min(its last submit + debounce, its first submit + max wait), within
POLL_INTERVAL plus ``--slack``. Prints one JSON line per scenario (each window: its submits,
first and last submit and its run, in seconds from the burst's start, its parameter and how
late it ran; the checks); exits 1 when a check fails. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

KEY = "document:1"


def log(message: str) -> None:
    throughput.log(message)


def burst(args: argparse.Namespace, max_wait: float | None) -> list[tuple[float, str, int]]:
    """Submit the burst: (time.time() after the submit, the task id it returned, its
    parameter) of each submit."""
    from django_reliable_executor import executor

    options: dict[str, Any] = {"debounce": args.debounce, "unique_key": KEY}
    if max_wait is not None:
        options["debounce_max_wait"] = max_wait
    gap = args.seconds / max(args.submits - 1, 1)
    start = time.time()
    submits = []
    for n in range(args.submits):
        # Evenly spread, from the burst's start (a slow submit does not push the rest back).
        time.sleep(max(0.0, start + n * gap - time.time()))
        task = executor.submit("demo.debounced", n, **options)
        submits.append((time.time(), task.task_id, n))
    return submits


def runs(journal: Path) -> list[dict[str, Any]]:
    if not journal.exists():
        return []
    lines = journal.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def scenario(store: throughput.Store, args: argparse.Namespace, name: str) -> dict[str, Any]:
    store.clear()
    max_wait = args.max_wait if name == "max_wait" else None
    with tempfile.TemporaryDirectory() as folder:
        journal = Path(folder) / "journal.jsonl"
        env = dict(os.environ, RE_JOURNAL=str(journal))
        worker = throughput.WorkerProcess(argparse.Namespace(threads=8, count_queries=None), env)
        try:
            worker.start()
            submits = burst(args, max_wait)
            log(f"{name}: {args.submits} submits in {submits[-1][0] - submits[0][0]:.1f}s")
            time.sleep(args.debounce + args.settle)
            worker.check_alive()
        finally:
            worker.stop()
        started = runs(journal)
    return report(args, name, started, submits, max_wait)


def report(
    args: argparse.Namespace,
    name: str,
    started: list[dict[str, Any]],
    submits: list[tuple[float, str, int]],
    max_wait: float | None,
) -> dict[str, Any]:
    """The scenario's windows (one task each: the submits that returned its id), their runs
    from the journal, and the checks: every window ran once, with its last submit's
    parameter, at min(its last submit + debounce, its first + max wait) within
    POLL_INTERVAL (plus ``--slack``); without a max wait, the whole burst is one window."""
    first = submits[0][0]
    windows: dict[str, list[tuple[float, int]]] = {}
    for at, task_id, n in submits:
        windows.setdefault(task_id, []).append((at, n))
    ran: dict[str, list[dict[str, Any]]] = {}
    for record in started:
        ran.setdefault(record["task"], []).append(record)
    from django_reliable_executor import executor

    slack = executor.settings.POLL_INTERVAL + args.slack
    rows, checks = (
        [],
        {"every_window_ran_once": True, "with_its_last_parameter": True, "when_due": True},
    )
    for task_id, joined in windows.items():
        due = joined[-1][0] + args.debounce
        if max_wait is not None:
            due = min(due, joined[0][0] + max_wait)
        runs_of = ran.get(task_id, [])
        late = round(runs_of[0]["t"] - due, 3) if runs_of else None
        checks["every_window_ran_once"] &= len(runs_of) == 1
        checks["with_its_last_parameter"] &= bool(runs_of) and runs_of[0]["param"] == joined[-1][1]
        checks["when_due"] &= late is not None and -0.05 <= late <= slack
        rows.append(
            {
                "submits": len(joined),
                "first_s": round(joined[0][0] - first, 2),
                "last_s": round(joined[-1][0] - first, 2),
                "ran_s": round(runs_of[0]["t"] - first, 2) if runs_of else None,
                "param": runs_of[0]["param"] if runs_of else None,
                "late_s": late,
            }
        )
    checks["no_other_runs"] = set(ran) <= set(windows)
    if max_wait is None:
        checks["one_window"] = len(windows) == 1
    return {
        "scenario": name,
        "storage": args.storage,
        "submits": args.submits,
        "seconds": args.seconds,
        "debounce": args.debounce,
        "max_wait": max_wait,
        "burst_s": round(submits[-1][0] - first, 2),
        "poll_interval_plus_slack_s": slack,
        "windows": rows,
        "checks": checks,
        "ok": all(checks.values()),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    throughput.add_store_arguments(parser, "reliable_executor_debounce")
    parser.add_argument("--submits", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0, help="the burst's length")
    parser.add_argument("--debounce", type=float, default=10.0)
    parser.add_argument("--max-wait", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=3.0, help="waited past the last due run")
    parser.add_argument("--slack", type=float, default=0.5, help="beyond POLL_INTERVAL, seconds")
    parser.add_argument("--scenarios", default="debounce,max_wait")
    args = parser.parse_args(argv)
    args.poll_interval = None
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results = []
    try:
        store = throughput.open_store(args)
        log(f"store: {store.describe()}; code: {throughput.code_version()}")
        log(throughput.machine_load())
        try:
            for name in args.scenarios.split(","):
                results.append(scenario(store, args, name))
                print(json.dumps(results[-1]), flush=True)
            store.clear()
        finally:
            store.close()
        log(throughput.machine_load())
    except throughput.BenchError as exc:
        log(f"error: {exc}")
        return 1
    return 0 if all(result["ok"] for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
