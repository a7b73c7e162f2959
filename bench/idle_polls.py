#!/usr/bin/env python
"""What an idle worker sends to Redis per poll, shard by shard, read with MONITOR.

    python bench/idle_polls.py --shards 4 [--queues 4] [--workers 1] [--seconds 20]

Starts a throw-away redis-server (tests/support/redis_servers.py, on a free port in a temporary
directory: never the shared server on 6379) and ``--workers`` idle ``runexecutor`` processes
(``REDIS_SHARDS = --shards``, ``POLL_INTERVAL = 1``, default lease and master lock TTL), each
serving ``--queues`` queues, which are picked so that they fall on the shards in turn (queue i
on shard i mod N). No task is submitted. Once every worker is ready and a few seconds have
passed (its start-up writes are not counted), it records every command the workers send for
``--seconds`` seconds with MONITOR (not those the scripts run) and sorts them: scripts by name
(SHA1 of storage/redis/lua/), other commands by name, and each by the shard whose keys it names.

Prints one JSON line: ``per_poll`` is the count divided by the polls (``--seconds`` over
POLL_INTERVAL, times the workers): ``claim`` is the fetchers' claim.lua, ``blpop`` their waits,
the rest the heartbeats (``heartbeat``, the registry's writes) and the chores (``promote``,
``lock_acquire``, ...); ``per_shard`` the same by shard.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from cluster import script_names  # noqa: E402 - bench/ is on sys.path when run as a script

from tests.support.redis_servers import RedisServer  # noqa: E402

POLL_INTERVAL = 1.0
SETTLE_SECONDS = 5.0  # after the workers are ready: their start-up commands are not counted


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def queue_names(count: int, shards: int) -> list[str]:
    """``count`` queue names, the i-th on shard i mod ``shards`` (sharding.shard_of's hash)."""
    names: list[str] = []
    candidate = 0
    while len(names) < count:
        name = f"q{candidate}"
        if zlib.crc32(name.encode()) % shards == len(names) % shards:
            names.append(name)
        candidate += 1
    return names


def shard_prefixes(prefix: str, shards: int) -> list[str]:
    from django_reliable_executor.storage.redis.sharding import ShardLayout

    return list(ShardLayout(prefix, shards).prefixes)


def environment(url: str, prefix: str, shards: int, sqlite_path: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("RE_") and key != "DJANGO_SETTINGS_MODULE"
    }
    env.update(
        RE_BENCH_REDIS_URL=url,
        RE_BENCH_KEY_PREFIX=prefix,
        RE_POLL_INTERVAL=str(POLL_INTERVAL),
        RE_SQLITE_PATH=str(sqlite_path),
        DJANGO_SETTINGS_MODULE="bench_settings",
        PYTHONUNBUFFERED="1",
    )
    if shards > 1:
        env["RE_BENCH_REDIS_SHARDS"] = str(shards)
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH), str(ROOT / "testproject"), str(ROOT)])
    return env


def start_worker(env: dict[str, str], queues: Sequence[str], log_path: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        str(ROOT / "testproject" / "manage.py"),
        "runexecutor",
        "--queues",
        ",".join(queues),
    ]
    with open(log_path, "wb") as out:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=out)


def record(server: RedisServer, prefixes: Sequence[str], seconds: float) -> dict[str, Any]:
    """Every command for ``seconds``: counts by name and by (shard, name)."""
    names = script_names()
    by_name: collections.Counter[str] = collections.Counter()
    by_shard: collections.Counter[tuple[int, str]] = collections.Counter()

    def shard_of_line(words: list[str]) -> int | None:
        for word in words[1:]:
            for shard, prefix in enumerate(prefixes):
                if word.startswith(prefix):
                    return shard
        return None

    def count(line: dict[str, Any]) -> None:
        if line.get("client_type") == "lua":  # run inside a script: no round trip
            return
        words = line["command"].split()
        command = words[0].lower()
        if command in ("monitor", "info"):
            return
        name = names.get(words[1], words[1]) if command == "evalsha" else command
        by_name[name] += 1
        shard = shard_of_line(words)
        if shard is not None:
            by_shard[(shard, name)] += 1

    with server.monitored(count):
        time.sleep(seconds)
    return {"by_name": dict(by_name), "by_shard": dict(by_shard)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"idle-{uuid.uuid4().hex[:8]}"
    queues = queue_names(args.queues, args.shards)
    prefixes = shard_prefixes(prefix, args.shards)
    with tempfile.TemporaryDirectory(prefix="re-bench-idle-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        workers: list[subprocess.Popen] = []
        try:
            env = environment(server.url, prefix, args.shards, Path(tmp) / "db.sqlite3")
            subprocess.run(
                [sys.executable, str(ROOT / "testproject" / "manage.py"), "migrate", "-v", "0"],
                env=env,
                check=True,
            )
            for i in range(args.workers):
                workers.append(start_worker(env, queues, Path(tmp) / f"worker{i}.log"))
            for worker in workers:
                assert worker.stdout is not None
                ready = worker.stdout.readline().decode().strip()
                if not ready:
                    raise RuntimeError(f"a worker exited before it was ready: {ready!r}")
                log(f"worker ready: {ready}")
            time.sleep(SETTLE_SECONDS)
            log(f"recording {args.seconds:.0f}s of idle polls (queues {', '.join(queues)})")
            seen = record(server, prefixes, args.seconds)
        finally:
            for worker in workers:
                worker.terminate()
            for worker in workers:
                try:
                    worker.wait(30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            server.stop()
    polls = args.seconds / POLL_INTERVAL * args.workers
    per_shard: dict[str, dict[str, float]] = {}
    for (shard, name), count in sorted(seen["by_shard"].items()):
        per_shard.setdefault(str(shard), {})[name] = round(count / polls, 2)
    return {
        "shards": args.shards,
        "queues": args.queues,
        "workers": args.workers,
        "seconds": args.seconds,
        "poll_interval": POLL_INTERVAL,
        "commands_per_poll": round(sum(seen["by_name"].values()) / polls, 2),
        "per_poll": {
            name: round(count / polls, 2)
            for name, count in sorted(seen["by_name"].items(), key=lambda item: -item[1])
        },
        "per_shard": per_shard,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1, help="REDIS_SHARDS (default 1)")
    parser.add_argument("--queues", type=int, default=4, help="queues per worker (default 4)")
    parser.add_argument("--workers", type=int, default=1, help="idle workers (default 1)")
    parser.add_argument("--seconds", type=float, default=20.0, help="recorded (default 20)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    print(json.dumps(run(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
