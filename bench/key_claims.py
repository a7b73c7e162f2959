#!/usr/bin/env python
"""What per-key concurrency costs a claim: claim rounds with 1,000 active keys against rounds
without keys.

    python bench/key_claims.py --storage {sqlite,mariadb,postgres,redis} [--keys 1000]

On a store of its own (as bench/throughput.py's, under the name ``reliable_executor_keys``),
this process claims as a worker of ``--slots`` threads would, one claim call per round, and
times each call (the round's starts and completions are not timed):

1. ``plain``: ``demo.noop`` tasks, claimed without limits (a round without keys);
2. ``keyless``: ``demo.keyed`` tasks without a key, claimed under the name's per-key cap (the
   per-key claim's own statements, with no key to count);
3. ``keyed``: ``demo.keyed`` tasks (``max_concurrency_per_key=2``) of ``--keys`` keys, three
   waiting per key, beside one key's backlog of ``--backlog`` tasks held at its cap (its first
   two run the whole time: the claim must not read past the rest).

Each round claims up to ``--slots`` tasks, starts and completes them, and submits one task of
the same key for each (so the keys stay active and the backlog stays held). The first
``--warmup`` rounds are not counted (the backlog is parked by the first claims that meet it).
Target (docs/benchmarks.md): ``keyed`` p95 at most 2 ms above ``plain`` p95 on PostgreSQL and
MariaDB, 0.5 ms on Redis. Prints one JSON line; progress and the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores of the throughput benchmark

TARGET_MS = {"postgres": 2.0, "mariadb": 2.0, "redis": 0.5, "sqlite": 2.0}
LEASE = 60.0
BUSY = "busy"
SCENARIOS = ("plain", "keyless", "keyed")


def log(message: str) -> None:
    throughput.log(message)


def fill(name: str, keys: list[str | None]) -> None:
    """Submit one task of ``name`` per entry of ``keys`` (None: without a key)."""
    from django_reliable_executor import TaskSubmitRequest, executor

    for start in range(0, len(keys), 1000):
        executor.submit_many(
            [TaskSubmitRequest(name, concurrency_key=key) for key in keys[start : start + 1000]]
        )


def rounds(name: str, args: argparse.Namespace, key_limits: dict[str, int]) -> list[float]:
    """Milliseconds of each counted claim call; each claimed task is run and replaced."""
    from django_reliable_executor import executor

    storage = executor.storage
    times: list[float] = []
    for index in range(args.warmup + args.rounds):
        began = time.perf_counter()
        claims = storage.claim(
            "bench-keys", ["default"], args.slots, LEASE, key_limits=key_limits or None
        )
        took = (time.perf_counter() - began) * 1000
        if index >= args.warmup:
            times.append(took)
        replaced: list[str | None] = []
        for claim in claims:
            if claim.task.concurrency_key == BUSY:
                continue  # held the whole time: the rest of its backlog waits at its cap
            started = storage.start(claim, LEASE)
            if started is not None:
                storage.complete(started, None)
            replaced.append(claim.task.concurrency_key)
        fill(name, replaced)
    return times


def scenario(store: throughput.Store, args: argparse.Namespace, which: str) -> list[float]:
    store.clear()
    if which == "plain":
        fill("demo.noop", [None] * (args.keys * 3 + args.backlog))
        return rounds("demo.noop", args, {})
    if which == "keyless":
        fill("demo.keyed", [None] * (args.keys * 3 + args.backlog))
        return rounds("demo.keyed", args, {"demo.keyed": 2})
    # The backlog first: older than every other key's tasks, and read first in pickup order.
    keys = [BUSY] * args.backlog + [f"tenant-{i}" for i in range(args.keys)] * 3
    fill("demo.keyed", keys)
    return rounds("demo.keyed", args, {"demo.keyed": 2})


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figures(times: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(statistics.median(times), 3),
        "p95_ms": round(percentile(times, 0.95), 3),
        "p99_ms": round(percentile(times, 0.99), 3),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    throughput.add_store_arguments(parser, "reliable_executor_keys")
    parser.add_argument("--keys", type=int, default=1000, help="active keys (default 1000)")
    parser.add_argument("--backlog", type=int, default=1000, help="one key's held backlog")
    parser.add_argument("--slots", type=int, default=8, help="tasks a claim asks for (8)")
    parser.add_argument("--rounds", type=int, default=1000, help="counted rounds (1000)")
    parser.add_argument("--warmup", type=int, default=50, help="rounds not counted (50)")
    parser.add_argument("--alternations", type=int, default=2, help="plain/keyed pairs (2)")
    args = parser.parse_args(argv)
    args.poll_interval = None
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    times: dict[str, list[float]] = {which: [] for which in SCENARIOS}
    try:
        store = throughput.open_store(args)
        log(f"store: {store.describe()}; code: {throughput.code_version()}")
        load_before = throughput.machine_load()
        log(load_before)
        try:
            for _ in range(args.alternations):  # alternated: a drift hits both alike
                for which in SCENARIOS:
                    times[which] += scenario(store, args, which)
                    log(f"{which}: {figures(times[which])}")
            store.clear()
        finally:
            store.close()
        load_after = throughput.machine_load()
    except throughput.BenchError as exc:
        log(f"error: {exc}")
        return 1
    plain, keyless, keyed = (figures(times[which]) for which in SCENARIOS)
    result: dict[str, Any] = {
        "storage": store.name,
        "keys": args.keys,
        "backlog": args.backlog,
        "slots": args.slots,
        "rounds": len(times["keyed"]),
        "plain": plain,
        "keyless": keyless,
        "keyed": keyed,
        "p95_added_ms": round(keyed["p95_ms"] - plain["p95_ms"], 3),
        "p95_added_over_keyless_ms": round(keyed["p95_ms"] - keyless["p95_ms"], 3),
        "target_added_ms": TARGET_MS[store.name],
        "load": [load_before, load_after],
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
