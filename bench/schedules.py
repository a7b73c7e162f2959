#!/usr/bin/env python
"""How fast the master fires a million interval schedules, and how late.

    python bench/schedules.py --storage {redis,postgres,mariadb,sqlite} [--n 1000000] [--rate R]

On a store of its own (the database or key prefix of bench/throughput.py's stores, under
another name: ``reliable_executor_schedule_bench``), emptied first and at the end, also after
an error, Ctrl-C or SIGTERM (a million schedules must not stay behind on a shared server):

1. create: ``--n`` interval schedules through ``executor.schedule_many`` in batches of
   ``--batch``, every one ``n / rate`` seconds apart in phase so that at steady state ``--rate``
   runs come due per second; nothing is due while they are created. On Redis, the memory they
   take (INFO used_memory, before and after) per schedule.
2. backlog: the master's firing code (ScheduleFiring, as runexecutor's master runs it, in this
   process) with its clock moved to a moment when every schedule is due at once: the most fires
   per second it reaches, firing all ``n`` runs as ordinary tasks.
3. steady: the clock set back to real time speed, at the moment the next runs start to come due:
   for ``--seconds`` seconds runs come due at ``--rate`` per second and the master loop fires
   them as they come (a round, then a sleep until the next run is due, at most 1 s, as the
   worker's master loop does). Reports the fires per second it kept up, and the lag of every
   fire: from its planned time until its task was stored (p50, p99, max).

Prints one JSON line on stdout; progress goes to stderr. Nothing here runs the tasks: firing is
the master's work, executing them the workers' (bench/throughput.py measures that).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores of the throughput benchmark, reused

DEFAULT_NAME = "reliable_executor_schedule_bench"
DEFAULT_RATES = {"redis": 5000, "postgres": 1000, "mariadb": 1000, "sqlite": 1000}


def log(message: str) -> None:
    throughput.log(message)


class ShiftedClock:
    """Real time moved by an offset the benchmark sets (phases 2 and 3)."""

    def __init__(self) -> None:
        self.offset = dt.timedelta(0)

    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.timezone.utc) + self.offset


def create(executor: Any, n: int, every: float, first: dt.datetime, batch: int) -> float:
    """Create the schedules; returns seconds taken."""
    from django_reliable_executor import Schedule

    started = time.perf_counter()
    step = every / n
    progress = throughput._progress(n, "schedules created")
    for low in range(0, n, batch):
        specs = [
            Schedule(
                schedule_id=f"bench-{i:07d}",
                task_name="demo.echo",
                parameter={"i": i},
                every=every,
                start_at=first + dt.timedelta(seconds=i * step),
                # The backlog phase fires runs up to minutes late: fire each, drop none.
                misfire="catch_up",
            )
            for i in range(low, min(n, low + batch))
        ]
        executor.schedule_many(specs)
        progress(low + len(specs))
    return time.perf_counter() - started


def percentile(values: Sequence[float], q: float) -> float:
    return throughput.percentile(sorted(values), q)


def backlog(firing: Any, clock: ShiftedClock, n: int, all_due: dt.datetime) -> dict[str, Any]:
    """Every schedule due at once: fire them all as fast as the master's rounds go."""
    clock.offset = all_due - dt.datetime.now(dt.timezone.utc)
    fired = 0
    rounds = 0
    started = time.perf_counter()
    progress = throughput._progress(n, "runs fired (backlog)")
    while fired < n:
        created, due = firing.fire_due()
        fired += len(created)
        rounds += 1
        progress(fired)
        if due == 0:
            break
    seconds = time.perf_counter() - started
    return {"fired": fired, "seconds": round(seconds, 2), "fires_per_s": round(fired / seconds)}


def steady(
    firing: Any, clock: ShiftedClock, resume_at: dt.datetime, seconds: float
) -> dict[str, Any]:
    """Runs come due at the configured rate: fire them as the master loop does, timing lag."""
    clock.offset = resume_at - dt.datetime.now(dt.timezone.utc)
    lags: list[float] = []
    fired = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        created, due = firing.fire_due()
        stored = clock.now()
        fired += len(created)
        lags.extend((stored - task.run_at).total_seconds() for task in created)
        if due >= firing.per_round:
            continue
        next_due = firing.next_due()
        wait = 1.0 if next_due is None else (next_due - clock.now()).total_seconds()
        time.sleep(min(max(wait, 0.0), 1.0))
    elapsed = time.perf_counter() - started
    lags_ms = [lag * 1000 for lag in lags]
    return {
        "fired": fired,
        "seconds": round(elapsed, 1),
        "fires_per_s": round(fired / elapsed),
        "lag_p50_ms": round(percentile(lags_ms, 0.50), 1) if lags else None,
        "lag_p99_ms": round(percentile(lags_ms, 0.99), 1) if lags else None,
        "lag_max_ms": round(max(lags_ms), 1) if lags else None,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    throughput.add_store_arguments(parser, DEFAULT_NAME)
    parser.add_argument("--n", type=int, default=1_000_000, help="schedules")
    parser.add_argument("--rate", type=int, help="runs due per second at steady state")
    parser.add_argument("--seconds", type=float, default=30.0, help="steady phase length")
    parser.add_argument("--batch", type=int, default=1000, help="schedules per schedule_many")
    parser.add_argument("--fire-batch", type=int, default=1000, help="schedules per round")
    parser.add_argument("--keep", action="store_true", help="leave the store filled at the end")
    args = parser.parse_args(argv)
    args.rate = args.rate or DEFAULT_RATES[args.storage]
    args.poll_interval = None
    args.conn_max_age = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    store = throughput.open_store(args)
    log(f"store: {store.describe()}; code: {throughput.code_version()}")
    log(throughput.machine_load())
    store.clear()
    try:
        # A million schedules and as many tasks must not stay behind on a shared server: the
        # store is emptied on the way out, also after an error, Ctrl-C or SIGTERM (a run
        # killed outright leaves them to the next run's emptying at its start).
        with throughput.terminate_on_sigterm():
            result = run(args, store)
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    finally:
        if not args.keep:
            log("emptying the store")
            store.clear()
        store.close()
    print(json.dumps(result))
    return 0


def run(args: argparse.Namespace, store: Any) -> dict[str, Any]:
    """The three phases on the (empty) store."""
    from django_reliable_executor import ReliableExecutor, executor
    from django_reliable_executor.master.schedule_firing import ScheduleFiring

    rtt = store.rtt_ms(args.rtt_rounds)
    every = args.n / args.rate
    result: dict[str, Any] = {
        "storage": store.name,
        "n": args.n,
        "every_s": round(every, 3),
        "rate": args.rate,
        "rtt_ms": round(rtt, 3),
    }
    redis_client = store.client() if isinstance(store, throughput.RedisStore) else None
    memory_before = redis_client.info("memory")["used_memory"] if redis_client else 0
    # Phase 1: nothing comes due while the schedules are created (the first an hour ahead).
    first = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) + dt.timedelta(hours=1)
    seconds = create(executor, args.n, every, first, args.batch)
    result["create_s"] = round(seconds, 1)
    result["create_per_s"] = round(args.n / seconds)
    log(f"created {args.n} schedules in {seconds:.1f} s ({args.n / seconds:.0f}/s)")
    if redis_client:
        used = redis_client.info("memory")["used_memory"] - memory_before
        result["redis_bytes_per_schedule"] = round(used / args.n)
        log(f"Redis memory: {used / args.n:.0f} bytes per schedule")

    clock = ShiftedClock()
    firing = ScheduleFiring(ReliableExecutor(executor.storage, clock=clock), args.fire_batch)  # type: ignore[arg-type]
    # Phase 2: the last schedule's first run is due: every one is, at once.
    last_first = first + dt.timedelta(seconds=(args.n - 1) * every / args.n)
    result["backlog"] = backlog(firing, clock, args.n, last_first + dt.timedelta(milliseconds=1))
    log(f"backlog: {result['backlog']}")
    # Phase 3: from the earliest next run on, runs come due at --rate per second (the next
    # runs still lie one per n / rate seconds apart in phase).
    resume_at = firing.next_due() or first
    result["steady"] = steady(firing, clock, resume_at, args.seconds)
    log(f"steady: {result['steady']}")
    return result


if __name__ == "__main__":
    sys.exit(main())
