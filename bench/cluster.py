#!/usr/bin/env python
"""What a task costs a Redis Cluster, per master and per script, and what it costs the worker.

    python bench/cluster.py --n 20000 [--masters 3] [--threads 8] [--queues 1] [--shards 1]

Starts a throw-away Redis Cluster (``--masters`` masters, ``--replicas`` replicas each, on free
ports in a temporary directory, with tests/support/redis_servers.py; stopped at the end: never the
shared server on 6379), then, under a key prefix of its own:

1. ``submit``: N ``demo.noop`` tasks with ``executor.submit_many`` (batches of ``--batch``),
   spread round-robin over ``--queues`` queues (``q0`` ... ``q<Q-1>``);
2. ``drain``: ONE ``runexecutor`` process (``--threads`` pool threads, every queue) runs them.

Around each phase every master is read: ``INFO commandstats`` (calls and microseconds per
command: the time Redis spent executing them) and ``INFO cpu`` (``used_cpu_sys`` +
``used_cpu_user``: the whole server process, network I/O and the Cluster bus included). The
deltas, divided by N, are the Redis-side cost per task, per master, with each master's share.
The worker's CPU per task is its process's user + system time over the drain (/proc, Linux).

A second drain of the same size (``--per-script``, default on) runs with ``SLOWLOG`` recording
every command (``slowlog-log-slower-than 0``): EVALSHA names only a script's SHA1 in
commandstats, the slowlog has its arguments, so each script's calls and microseconds are
summed by SHA1 (mapped to the script names of storage/redis/lua/). It is a separate pass because the
slowlog costs Redis time of its own; its figures are for the split between scripts only.

``--shards N`` sets ``REDIS_SHARDS`` (the queues spread over N hash tags) and ``--queues Q``
spreads the tasks over Q queues; with N above 1 the queues are named so that queue i is on shard
i mod N (``queue_names``), so a Q that is a multiple of N gives every shard the same tasks.
``--shards`` above 1 is refused by a version without that setting.

Prints exactly one JSON line on stdout; progress and the machine's load go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the worker process and helpers of the throughput benchmark

TASK_NAME = "demo.noop"
SLOWLOG_MAX = 2_000_000  # entries kept per master in the per-script pass


def log(message: str) -> None:
    throughput.log(message)


# --------------------------------------------------------------------------------------------
# The Cluster and what its masters report
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Sample:
    """One master's counters at one moment."""

    commands: dict[str, tuple[int, int]]  # command -> (calls, usec)
    cpu_seconds: float  # used_cpu_sys + used_cpu_user


def sample(node: Any) -> Sample:
    with node.client() as admin:
        stats = admin.info("commandstats")
        cpu = admin.info("cpu")
    commands = {
        name.removeprefix("cmdstat_"): (int(value["calls"]), int(value["usec"]))
        for name, value in stats.items()
    }
    return Sample(commands, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]))


def sample_all(masters: Sequence[Any]) -> list[Sample]:
    return [sample(node) for node in masters]


def deltas(before: Sample, after: Sample) -> tuple[dict[str, tuple[int, int]], float]:
    """(command -> (calls, usec) added between the samples, CPU seconds added)."""
    commands = {}
    for name, (calls, usec) in after.commands.items():
        old_calls, old_usec = before.commands.get(name, (0, 0))
        if calls > old_calls:
            commands[name] = (calls - old_calls, usec - old_usec)
    return commands, after.cpu_seconds - before.cpu_seconds


SCRIPT_COMMANDS = ("evalsha", "evalsha_ro", "eval", "eval_ro", "fcall", "fcall_ro")


def phase_figures(
    masters: Sequence[Any], before: list[Sample], after: list[Sample], n: int, owners: list[str]
) -> dict[str, Any]:
    """Per master and in total, per task: Redis CPU (INFO cpu), commands executed, and the
    microseconds spent in scripts (EVALSHA/EVAL/FCALL: a script's time includes the commands
    it runs). Each master's share of the CPU. Per command, summed over the masters: commands
    run inside scripts are counted under their own names too (Redis counts both), so the
    per-command times overlap the scripts' and are not to be added up."""
    rows = []
    by_command: dict[str, list[int]] = {}
    for node, old, new in zip(masters, before, after, strict=True):
        commands, cpu = deltas(old, new)
        for name, (c, u) in commands.items():
            entry = by_command.setdefault(name, [0, 0])
            entry[0] += c
            entry[1] += u
        calls = sum(c for c, _ in commands.values())
        scripts = sum(u for name, (_, u) in commands.items() if name in SCRIPT_COMMANDS)
        rows.append((node, calls, scripts, cpu))
    total_cpu = sum(cpu for *_, cpu in rows)
    per_master = [
        {
            "node": f"{node.host}:{node.port}",
            "holds": owners[masters.index(node)],
            "calls": calls,
            "calls_per_task": round(calls / n, 2),
            "cpu_us_per_task": round(1e6 * cpu / n, 2),
            "cpu_share": round(cpu / total_cpu, 3) if total_cpu else 0.0,
            "scripts_us_per_task": round(scripts / n, 2),
        }
        for node, calls, scripts, cpu in rows
    ]
    commands = {
        name: {
            "calls": calls,
            "us_per_call": round(usec / calls, 2),
            "us_per_task": round(usec / n, 2),
        }
        for name, (calls, usec) in sorted(by_command.items(), key=lambda item: -item[1][1])
    }
    return {
        "cpu_us_per_task": round(1e6 * total_cpu / n, 2),
        "scripts_us_per_task": round(sum(r[2] for r in rows) / n, 2),
        "calls_per_task": round(sum(r[1] for r in rows) / n, 2),
        "per_master": per_master,
        "per_command": commands,
    }


def script_names() -> dict[str, str]:
    """SHA1 -> name of every transition script, as the storage loads them."""
    from django_reliable_executor.storage.redis.scripts import NAMES, source

    return {hashlib.sha1(source(name).encode()).hexdigest(): name for name in NAMES}


@contextlib.contextmanager
def slowlog_everything(masters: Sequence[Any]) -> Iterator[None]:
    """Every command every master runs goes to its slowlog meanwhile (emptied first)."""
    for node in masters:
        with node.client() as admin:
            admin.config_set("slowlog-max-len", SLOWLOG_MAX)
            admin.slowlog_reset()
            admin.config_set("slowlog-log-slower-than", 0)
    try:
        yield
    finally:
        for node in masters:
            with node.client() as admin:
                admin.config_set("slowlog-log-slower-than", 10000)


def per_script(masters: Sequence[Any], n: int) -> dict[str, Any]:
    """Each script's (EVALSHA by SHA1) calls and microseconds, and each other command sent by
    a client, from every master's slowlog; with the commands each script ran inside it
    (logged before it, from the client "?:0"), per call."""
    names = script_names()
    totals: dict[str, list[int]] = {}  # name -> [calls, usec, inner commands]
    for node in masters:
        with node.client(socket_timeout=120) as admin:
            entries = admin.slowlog_get(SLOWLOG_MAX)
            admin.slowlog_reset()
        inner = 0
        for entry in sorted(entries, key=lambda e: e["id"]):
            if _text(entry["client_address"]) == "?:0":  # run by a script: counted in it
                inner += 1
                continue
            parts = _text(entry["command"]).split()
            verb = parts[0].upper() if parts else "?"
            if verb in ("EVALSHA", "EVALSHA_RO") and len(parts) > 1:
                key = "script:" + names.get(parts[1], parts[1][:12])
            elif verb in ("FCALL", "FCALL_RO") and len(parts) > 1:
                key = "function:" + parts[1]
            else:
                key = verb.lower()
            total = totals.setdefault(key, [0, 0, 0])
            total[0] += 1
            total[1] += int(entry["duration"])
            total[2] += inner
            inner = 0
    all_usec = sum(usec for _, usec, _ in totals.values()) or 1
    return {
        name: {
            "calls": calls,
            "calls_per_task": round(calls / n, 3),
            "us_per_call": round(usec / calls, 2),
            "us_per_task": round(usec / n, 2),
            "share": round(usec / all_usec, 3),
            **({"commands_per_call": round(inner / calls, 1)} if inner else {}),
        }
        for name, (calls, usec, inner) in sorted(totals.items(), key=lambda item: -item[1][1])
    }


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def check_shards(shards: int) -> None:
    """Refuse ``--shards`` above 1 unless this version has the REDIS_SHARDS setting."""
    from django_reliable_executor.conf import ExecutorSettings

    names = {field.name for field in dataclasses.fields(ExecutorSettings)}
    if shards > 1 and "REDIS_SHARDS" not in names:
        raise throughput.BenchError(
            f"--shards {shards}: this version has no REDIS_SHARDS setting, so every queue of "
            "a key prefix lives in one hash slot (one master); only --shards 1 can be measured"
        )


def environment(url: str, prefix: str, shards: int, sqlite_path: Path) -> dict[str, str]:
    """The environment of this process and its worker: the bench settings on the Cluster."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RE_BENCH_")
        and key
        not in (
            "RE_TEST_DB_NAMES",
            "RE_DB_SUFFIX",
            "RE_POLL_INTERVAL",
            "RE_STORAGE",
            "RE_KEY_PREFIX",
            "RE_REDIS_URL",
            "RE_REDIS_CLUSTER",
        )
    }
    env.update(
        RE_BENCH_REDIS_URL=url,
        RE_BENCH_REDIS_CLUSTER="1",
        RE_BENCH_KEY_PREFIX=prefix,
        RE_SQLITE_PATH=str(sqlite_path),
        DJANGO_SETTINGS_MODULE="bench_settings",
    )
    if shards > 1:
        env["RE_BENCH_REDIS_SHARDS"] = str(shards)
    paths = [str(BENCH), str(ROOT / "testproject"), str(ROOT)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def queue_names(count: int, shards: int) -> list[str]:
    """``default`` alone, or ``count`` names: ``q0`` ... with one shard, and with more the
    first names ``q<k>`` that put the i-th queue on shard i mod ``shards`` (sharding.shard_of),
    so that the tasks, spread round-robin over the queues, spread evenly over the shards."""
    if count == 1:
        return ["default"]
    if shards == 1:
        return [f"q{i}" for i in range(count)]
    from django_reliable_executor.storage.redis.sharding import shard_of

    names: list[str] = []
    candidate = 0
    while len(names) < count:
        if shard_of(f"q{candidate}", shards) == len(names) % shards:
            names.append(f"q{candidate}")
        candidate += 1
    return names


def submit(n: int, batch: int, queues: Sequence[str]) -> float:
    """Submit n tasks round-robin over the queues; seconds taken."""
    from django_reliable_executor import TaskSubmitRequest, executor

    started = time.perf_counter()
    for first in range(0, n, batch):
        size = min(batch, n - first)
        executor.submit_many(
            [
                TaskSubmitRequest(TASK_NAME, queue=queues[(first + i) % len(queues)])
                for i in range(size)
            ]
        )
    return time.perf_counter() - started


def unfinished() -> int:
    from django_reliable_executor import TaskStatus, executor

    counts = executor.count_by_status()
    return sum(counts[s] for s in (TaskStatus.CREATED, TaskStatus.PENDING, TaskStatus.RUNNING))


def completed() -> int:
    from django_reliable_executor import TaskStatus, executor

    return executor.count_by_status()[TaskStatus.COMPLETED]


def forget_tasks(masters: Sequence[Any], prefix: str) -> None:
    """Delete every key of the prefix (on whichever master holds it)."""
    for node in masters:
        with node.client(socket_timeout=60) as admin:
            keys = list(admin.scan_iter(match="{" + prefix + "}:*", count=1000))
            for start in range(0, len(keys), 1000):
                admin.delete(*keys[start : start + 1000])


def drain(args: argparse.Namespace, queues: Sequence[str], stall_timeout: float) -> dict:
    """Run one worker until the N tasks are done; its CPU and the drain's seconds."""
    worker = throughput.WorkerProcess(args, dict(os.environ))
    worker.command += ["--queues", ",".join(queues)]
    try:
        ready = worker.start()
        cpu_at_ready = worker.cpu_seconds()
        last, last_change = -1, time.monotonic()
        while True:
            left = unfinished()
            if left == 0:
                break
            if left != last:
                last, last_change = left, time.monotonic()
            elif time.monotonic() - last_change > stall_timeout:
                raise throughput.BenchError(f"no progress for {stall_timeout:.0f}s, {left} left")
            worker.check_alive()
            time.sleep(0.05)
        seconds = time.time() - ready
        cpu = worker.cpu_seconds() - cpu_at_ready
    finally:
        worker.stop()
    return {"seconds": seconds, "worker_cpu_seconds": cpu}


def rtt_ms(node: Any, rounds: int = 200) -> float:
    with node.client() as admin:
        samples = []
        for i in range(rounds + 20):
            start = time.perf_counter()
            admin.ping()
            if i >= 20:
                samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def run(args: argparse.Namespace) -> dict[str, Any]:
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    check_shards(args.shards)
    from tests.support.redis_servers import SpareServers

    workdir = Path(tempfile.mkdtemp(prefix="re-bench-cluster-"))
    servers = SpareServers(workdir)
    try:
        log(f"starting a Cluster of {args.masters} masters, {args.replicas} replica(s) each")
        cluster = servers.replicated_cluster(args.masters, replicas=args.replicas)
        masters = cluster.masters()
        prefix = args.key_prefix or f"bench-{uuid.uuid4().hex[:8]}"
        env = environment(masters[0].url, prefix, args.shards, workdir / "bench.sqlite3")
        for key in set(os.environ) - set(env):
            del os.environ[key]
        os.environ.update(env)
        import django

        django.setup()
        from django_reliable_executor import executor
        from django_reliable_executor.storage.redis.connection import describe

        queues = queue_names(args.queues, args.shards)
        owners = []
        slots = cluster.slot_owners()
        for node in masters:
            served = sorted(slot for slot, port in slots.items() if port == node.port)
            owners.append(f"slots {served[0]}-{served[-1]}" if served else "no slots")
        prefix_master = cluster.master_of("{" + prefix + "}:counts")
        owners[masters.index(prefix_master)] += f", {{{prefix}}}"
        log(f"store: {describe(executor.settings)}, keys under {{{prefix}}}: on {prefix_master}")
        log(f"code: {throughput.code_version()}; {throughput.machine_load()}")
        rtt = rtt_ms(prefix_master)

        result: dict[str, Any] = {
            "n": args.n,
            "masters": args.masters,
            "replicas": args.replicas,
            "shards": args.shards,
            "queues": args.queues,
            "threads": args.threads,
            "rtt_ms": round(rtt, 3),
        }
        # 1. submit
        before = sample_all(masters)
        seconds = submit(args.n, args.batch, queues)
        after = sample_all(masters)
        result["submit_per_s"] = round(args.n / seconds, 1)
        result["submit"] = phase_figures(masters, before, after, args.n, owners)
        # 2. drain, one worker
        before = after
        done = drain(args, queues, args.stall_timeout)
        after = sample_all(masters)
        if completed() != args.n:
            raise throughput.BenchError(f"expected {args.n} COMPLETED, found {completed()}")
        result["drain_per_s"] = round(args.n / done["seconds"], 1)
        result["worker_cpu_us_per_task"] = round(1e6 * done["worker_cpu_seconds"] / args.n, 1)
        result["drain"] = phase_figures(masters, before, after, args.n, owners)
        log(
            f"drain: {result['drain_per_s']:.0f}/s; worker {result['worker_cpu_us_per_task']} "
            f"us CPU/task; Redis {result['drain']['cpu_us_per_task']} us CPU/task "
            f"({result['drain']['scripts_us_per_task']} us in scripts)"
        )
        # 3. the split between scripts, on a second drain with the slowlog on
        if args.per_script:
            forget_tasks(masters, prefix)
            with slowlog_everything(masters):
                submit(args.n, args.batch, queues)
                drain(args, queues, args.stall_timeout)
                result["per_script"] = per_script(masters, args.n)
        forget_tasks(masters, prefix)
        log(throughput.machine_load())
        return result
    finally:
        servers.stop_all()
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Redis-side CPU per task per Cluster master, and the worker's; one JSON line."
    )
    parser.add_argument("--n", type=int, default=20_000, help="tasks (default 20000)")
    parser.add_argument("--masters", type=int, default=3, help="Cluster masters (default 3)")
    parser.add_argument("--replicas", type=int, default=0, help="replicas per master (default 0)")
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads (default 8)")
    parser.add_argument("--batch", type=int, default=1000, help="submit_many batch size")
    parser.add_argument(
        "--shards", type=int, default=1, help="REDIS_SHARDS (default 1: one hash tag per prefix)"
    )
    parser.add_argument("--queues", type=int, default=1, help="queues the tasks spread over")
    parser.add_argument("--key-prefix", default=None, help="default: bench-<random>")
    parser.add_argument(
        "--per-script",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a second drain with the slowlog on, for each script's share (default on)",
    )
    parser.add_argument("--stall-timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    for key in ("n", "masters", "threads", "batch", "shards", "queues"):
        if getattr(args, key) < 1:
            parser.error(f"--{key} must be >= 1")
    if args.replicas < 0:
        parser.error("--replicas must be >= 0")
    args.count_queries = None  # throughput.WorkerProcess reads it
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with throughput.terminate_on_sigterm():
            result = run(args)
    except throughput.BenchError as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
