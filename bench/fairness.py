#!/usr/bin/env python
"""The fairness proof: one tenant's long backlog against ten small tenants, with a real worker,
read from the handler's own journal.

    python bench/fairness.py --storage {sqlite,mariadb,postgres,redis}
        [--big 10000] [--tenants 10] [--each 10] [--slots 8] [--sleep 1.0]
        [--scenarios fair,unfair]

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_fairness``),
one ``runexecutor`` process with ``--slots`` threads runs ``demo.fair``
(``fairness="round_robin"``) or, as the baseline, ``demo.unfair`` (the same handler without
it); each writes its start and end, with its tenant, to a journal. Once the worker is ready,
tenant A submits ``--big`` tasks of ``--sleep`` seconds (one submit_many), then tenants B, C,
... submit ``--each`` each (one submit per task), every task with its tenant as
``concurrency_key``.

Checked, per scenario, from the journal:

- ``small_last_start_s``: for each small tenant, its last task's start after its last submit;
  the fair scenario must keep every one within ``--within`` seconds (15).
- ``busy``: the share of the slots' time spent running tasks, from the first start until the
  last small tenant's task ended (the fair scenario) or over the same length of time (the
  baseline); must be at least 0.95 in the fair scenario.

The baseline runs for as long as the fair scenario took (at least ``--observe``) and counts the
small tenants' tasks that started meanwhile: without fairness they wait behind A's backlog,
``--big`` tasks of ``--sleep`` s at ``--slots`` at a time (printed as ``backlog_ahead_s``; and,
when some have not started, ``projected_small_last_start_s``: when the last one would, at the
rate the slots ran).
Prints one JSON line per scenario; exits 1 when a check of the fair scenario fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import string
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

BIG = "A"


def log(message: str) -> None:
    throughput.log(message)


def small_tenants(count: int) -> list[str]:
    return list(string.ascii_uppercase[1 : 1 + count])


def submit(args: argparse.Namespace, name: str) -> dict[str, float]:
    """A's backlog in one submit_many, then each small tenant's tasks one submit at a time:
    ``{tenant: time.time() after its last submit}``."""
    from django_reliable_executor import TaskSubmitRequest, executor

    backlog = [
        TaskSubmitRequest(
            task_name=name,
            task_parameter={"tenant": BIG, "sleep": args.sleep},
            concurrency_key=BIG,
        )
        for _ in range(args.big)
    ]
    for start in range(0, len(backlog), 1000):
        executor.submit_many(backlog[start : start + 1000])
    submitted = {BIG: time.time()}
    for tenant in small_tenants(args.tenants):
        for _ in range(args.each):
            executor.submit(name, {"tenant": tenant, "sleep": args.sleep}, concurrency_key=tenant)
        submitted[tenant] = time.time()
    return submitted


def records(journal: Path) -> list[dict[str, Any]]:
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


def small_done(journal: Path, args: argparse.Namespace) -> bool:
    """Every small tenant's every task has ended."""
    ends = [r for r in records(journal) if r["event"] == "end" and r["tenant"] != BIG]
    return len(ends) >= args.tenants * args.each


def scenario(
    store: throughput.Store, args: argparse.Namespace, name: str, observe: float
) -> dict[str, Any]:
    store.clear()
    handler = "demo.fair" if name == "fair" else "demo.unfair"
    with tempfile.TemporaryDirectory() as folder:
        journal = Path(folder) / "journal.jsonl"
        env = dict(os.environ, RE_JOURNAL=str(journal))
        worker = throughput.WorkerProcess(
            argparse.Namespace(threads=args.slots, count_queries=None), env
        )
        try:
            worker.start()
            submitted = submit(args, handler)
            log(f"{name}: {args.big} + {args.tenants}x{args.each} submitted")
            deadline = time.time() + observe
            while time.time() < deadline:
                if name == "fair" and small_done(journal, args):
                    break
                time.sleep(0.5)
                worker.check_alive()
        finally:
            worker.stop()
        if args.journal_dir:
            shutil.copy(journal, Path(args.journal_dir) / f"fairness-{args.storage}-{name}.jsonl")
        return report(args, name, records(journal), submitted, time.time())


def report(
    args: argparse.Namespace,
    name: str,
    journal: list[dict[str, Any]],
    submitted: dict[str, float],
    stopped: float,
) -> dict[str, Any]:
    starts = [r for r in journal if r["event"] == "start"]
    first = min((r["t"] for r in starts), default=stopped)
    late: dict[str, float | None] = {}
    started_small = 0
    for tenant in small_tenants(args.tenants):
        mine = [r["t"] for r in starts if r["tenant"] == tenant]
        started_small += len(mine)
        done = len(mine) >= args.each
        late[tenant] = round(max(mine) - submitted[tenant], 2) if done else None
    ends = {r["task"]: r["t"] for r in journal if r["event"] == "end"}
    small_ends = [t for r in starts if r["tenant"] != BIG and (t := ends.get(r["task"]))]
    until = max(small_ends) if name == "fair" and late and all(late.values()) else stopped
    window = max(until - first, 1e-9)
    ran = sum(max(0.0, min(ends.get(r["task"], until), until) - max(r["t"], first)) for r in starts)
    busy = ran / (args.slots * window)
    result: dict[str, Any] = {
        "scenario": name,
        "storage": args.storage,
        "big": args.big,
        "small": f"{args.tenants}x{args.each}",
        "slots": args.slots,
        "sleep_s": args.sleep,
        "window_s": round(window, 2),
        "starts": len(starts),
        "small_started": started_small,
        "small_last_start_s": late,
        "busy": round(busy, 4),
        "backlog_ahead_s": round(args.big * args.sleep / args.slots, 1),
    }
    if name != "fair" and started_small < args.tenants * args.each and starts:
        # Oldest first: the small tenants' last task starts once everything before it has,
        # at the rate the slots ran here.
        rate = len(starts) / window
        result["projected_small_last_start_s"] = round((args.big + args.tenants * args.each) / rate)
    if name == "fair":
        worst = [v for v in late.values() if v is not None]
        checks = {
            "every_small_task_started": started_small == args.tenants * args.each,
            "small_within": bool(worst) and len(worst) == len(late) and max(worst) <= args.within,
            "busy_at_least": busy >= args.busy,
        }
        result["checks"] = checks
        result["ok"] = all(checks.values())
    return result


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    throughput.add_store_arguments(parser, "reliable_executor_fairness")
    parser.add_argument("--big", type=int, default=10000, help="tenant A's backlog")
    parser.add_argument("--tenants", type=int, default=10, help="small tenants (B, C, ...)")
    parser.add_argument("--each", type=int, default=10, help="tasks per small tenant")
    parser.add_argument("--slots", type=int, default=8, help="the worker's threads")
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each task runs")
    parser.add_argument("--within", type=float, default=15.0, help="small tenants' target, s")
    parser.add_argument("--busy", type=float, default=0.95, help="the slots' busy target")
    parser.add_argument("--observe", type=float, default=60.0, help="longest run, seconds")
    parser.add_argument("--scenarios", default="fair,unfair")
    parser.add_argument("--journal-dir", help="keep each scenario's journal there")
    args = parser.parse_args(argv)
    args.poll_interval = None
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results: list[dict[str, Any]] = []
    try:
        store = throughput.open_store(args)
        log(f"store: {store.describe()}; code: {throughput.code_version()}")
        log(throughput.machine_load())
        try:
            observe = args.observe
            for name in args.scenarios.split(","):
                results.append(scenario(store, args, name, observe))
                print(json.dumps(results[-1]), flush=True)
                # the baseline watches as long as the fair run took, at least --observe
                observe = max(observe, results[-1]["window_s"] + 5)
            store.clear()
        finally:
            store.close()
        log(throughput.machine_load())
    except throughput.BenchError as exc:
        log(f"error: {exc}")
        return 1
    return 0 if all(result.get("ok", True) for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
