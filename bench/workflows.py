#!/usr/bin/env python
"""What dependencies cost the drain: one worker process, chained tasks against independent ones.

    python bench/workflows.py --storage {sqlite,mariadb,postgres,redis} --n 10000

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_flow``),
one ``runexecutor`` process with ``--threads`` pool threads drains, rounds alternated:

1. ``plain``: N ``demo.noop`` tasks, none depending on another;
2. ``paired``: N ``demo.noop`` tasks in pairs: N/2 independent ones, and N/2 each depending on
   one of those (released by its completion, in the completion's own transaction or script);
3. ``chained``: N ``demo.noop`` tasks as ``--chains`` chains (``executor.chain``): every task
   but the first of its chain depends on the one before it, so at most ``--chains`` tasks are
   ever due at once and each completion releases the next step.

Each drain figure is the median over ``--rounds`` of the seconds from the worker's ready line
until the tasks are done (polled every 20 ms). The release latency is, for every dependent of
the last ``paired`` and ``chained`` rounds, the time from its dependency's finish to its own
start (both as stored): p50 and p95 (a paired dependent also waits behind the independent
tasks due before it; a chained one only for the release and a claim). Target: ``paired``
drains at >= 70 % of ``plain``'s rate; ``chained`` shows what narrow chains cost on top.
Prints one JSON line; progress and the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import rate_limits  # noqa: E402 - its drain helpers
import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

TARGET_RATIO = 0.70


def submit(n: int, chains: int) -> list[list[str]]:
    """N demo.noop tasks: independent (``chains`` 0), in pairs (``chains`` -1), or as that many
    chains. Returns the task ids of the chains (pairs)."""
    from django_reliable_executor import TaskSubmitRequest, executor

    if not chains:
        rate_limits.submit("demo.noop", n)
        return []
    if chains < 0:
        pairs: list[list[str]] = []
        for start in range(0, n // 2, 500):
            size = min(500, n // 2 - start)
            roots = executor.submit_many([TaskSubmitRequest("demo.noop") for _ in range(size)])
            requests = [TaskSubmitRequest("demo.noop", depends_on=[r.task_id]) for r in roots]
            after = executor.submit_many(requests)
            pairs += [[r.task_id, a.task_id] for r, a in zip(roots, after, strict=True)]
        if n % 2:
            rate_limits.submit("demo.noop", 1)
        return pairs
    ids: list[list[str]] = []
    for chain in range(chains):
        length = n // chains + (1 if chain < n % chains else 0)
        steps = executor.chain([TaskSubmitRequest("demo.noop") for _ in range(length)])
        ids.append([step.task_id for step in steps])
    return ids


def drain(store: throughput.Store, args: argparse.Namespace, scenario: str) -> tuple[float, Any]:
    """Seconds from the worker's ready line until the scenario's N tasks are done, and the
    chains' ids."""
    store.clear()
    chains = submit(args.n, {"plain": 0, "paired": -1, "chained": args.chains}[scenario])
    store.after_load()
    worker = throughput.WorkerProcess(
        argparse.Namespace(threads=args.threads, count_queries=None), dict(os.environ)
    )
    try:
        ready = worker.start()
        done_at = rate_limits.wait_for(
            lambda: rate_limits.completed() >= args.n, worker, args.stall_timeout
        )
    finally:
        worker.stop()
    if rate_limits.completed() != args.n:
        raise throughput.BenchError(f"{scenario}: {rate_limits.completed()} of {args.n} done")
    seconds = done_at - ready
    throughput.log(f"{scenario}: {args.n} tasks in {seconds:.2f}s ({args.n / seconds:.0f}/s)")
    return seconds, chains


def release_latencies_ms(chains: list[list[str]]) -> list[float]:
    """For each dependent: its start minus its dependency's finish, in milliseconds."""
    from django_reliable_executor import executor

    latencies = []
    for chain in chains:
        found = executor.storage.get_many(chain)
        for before, after in zip(chain, chain[1:], strict=False):
            finished, started = found[before].finished_at, found[after].started_at
            if finished is not None and started is not None:
                latencies.append((started - finished).total_seconds() * 1000)
    return sorted(latencies)


def percentile(values: list[float], share: float) -> float | None:
    """The value ``share`` of the way up the sorted ``values`` (None when there are none)."""
    return round(values[min(int(len(values) * share), len(values) - 1)], 1) if values else None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_flow")
    parser.add_argument("--n", type=int, default=10_000, help="tasks per drain (default 10000)")
    parser.add_argument("--chains", type=int, default=100, help="chains (default 100)")
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario (default 3)")
    parser.add_argument("--stall-timeout", type=float, default=300.0)
    parser.add_argument("--poll-interval", type=float, default=None)
    args = parser.parse_args(argv)
    args.conn_max_age = None
    if min(args.n, args.chains, args.threads, args.rounds) < 1 or args.chains > args.n:
        parser.error("--n, --chains, --threads and --rounds must be >= 1, --chains <= --n")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scenarios = ("plain", "paired", "chained")

    def one_round(store: throughput.Store, name: str) -> tuple[float, list[float]]:
        took, chains = drain(store, args, name)
        return took, release_latencies_ms(chains) if chains else []

    rounds = throughput.alternate_rounds(args, scenarios, one_round)
    if isinstance(rounds, int):
        return rounds
    seconds = {name: [took for took, _ in values] for name, values in rounds.results.items()}
    # The release latencies of the last round of each scenario with dependents.
    latencies = {name: rounds.results[name][-1][1] for name in ("paired", "chained")}
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    result: dict[str, Any] = {
        "storage": rounds.storage,
        "n": args.n,
        "chains": args.chains,
        "threads": args.threads,
        **{f"{name}_per_s": round(args.n / value) for name, value in medians.items()},
        "paired_ratio": round(medians["plain"] / medians["paired"], 3),
        "chained_ratio": round(medians["plain"] / medians["chained"], 3),
        "target_ratio": TARGET_RATIO,
        **{
            f"{name}_release_{label}_ms": percentile(values, share)
            for name, values in latencies.items()
            for label, share in (("p50", 0.5), ("p95", 0.95))
        },
        "rounds": {name: [round(v, 2) for v in values] for name, values in seconds.items()},
        "load": rounds.load,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
