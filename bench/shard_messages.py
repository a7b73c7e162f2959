#!/usr/bin/env python
"""What a dependency or a batch member across Redis shards costs: round trips and Redis work.

    python bench/shard_messages.py --n 2000

Starts a private ``redis-server`` (tests/support/redis_servers.py) on a free port in a temporary
directory, and stops it at the end: it touches no other Redis. On a storage of REDIS_SHARDS = 3
(one server serves every shard's hash tag; on a Cluster the same commands run, each on its
shard's master), for N edges of each kind:

- ``dep-local`` / ``dep-cross``: N dependencies, then N dependents each awaiting one, on a queue
  of the same shard / of another shard than its dependency;
- ``batch-local`` / ``batch-cross``: one ``submit_batch`` of N members on a queue of shard 0
  (the batches' shard) / of shard 1, with an on_complete callback on the members' queue.

Two steps are measured each, called one task at a time (a worker's completions come in
batches: these are the figures of a batch of one): ``submit`` (the dependents one ``submit``
each; the batch's one ``submit_batch``), and ``end`` (each dependency or member completed with
``storage.complete``, claimed and started beforehand, unmeasured; a cross edge's delivery runs
inside that call). Per edge: client round trips (writes to a socket: a pipeline is one),
Redis commands (``INFO commandstats``, script-internal commands included) and Redis CPU
(``INFO cpu``, user + sys of the whole server, so noisy on a busy machine; the counts are not).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHARDS = 3
# Queues of shards 0 and 1 under REDIS_SHARDS = 3 (CRC-32 of the name modulo 3).
SHARD0, SHARD0B, SHARD1 = "orphan", "emails", "default"
LEASE = 300.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="edges of each kind (default 2000)")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()
    import redis.connection

    from django_reliable_executor import TaskSubmitRequest
    from django_reliable_executor.service.reliable_executor import ReliableExecutor
    from django_reliable_executor.storage.redis import RedisStorage
    from tests.support.redis_servers import RedisServer

    trips = [0]
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        trips[0] += 1
        send(self, command, check_health)

    redis.connection.AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]

    with tempfile.TemporaryDirectory(prefix="re-shard-messages-") as folder:
        server = RedisServer(Path(folder)).start()
        try:
            admin = server.client(decode_responses=True)
            client = redis.Redis.from_url(server.url, decode_responses=True)
            storage = RedisStorage(client, "bench-shard-messages", shards=SHARDS)
            executor = ReliableExecutor(storage)

            def measure(call: Any) -> dict[str, float]:
                admin.config_resetstat()
                before_cpu = _cpu(admin)
                before = trips[0]
                call()
                used = trips[0] - before
                stats = admin.info("commandstats")
                cpu = _cpu(admin) - before_cpu
                # The admin's own CONFIG RESETSTAT and INFO are left out.
                commands = sum(
                    int(v["calls"])
                    for k, v in stats.items()
                    if k not in ("cmdstat_info", "cmdstat_config|resetstat")
                )
                evalsha = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
                return {
                    "round_trips": round(used / args.n, 2),
                    "redis_commands": round(commands / args.n, 2),
                    "scripts": round(int(evalsha["calls"]) / args.n, 2),
                    "script_us": round(int(evalsha["usec"]) / args.n, 1),
                    "redis_cpu_us": round(cpu * 1e6 / args.n, 1),
                }

            def end_each(queue: str, count: int) -> None:
                claims = []
                while len(claims) < count:
                    claims += storage.claim("bench", [queue], 500, LEASE)
                started = storage.start_many(claims, LEASE)

                def complete() -> None:
                    for claim in started:
                        assert claim is not None
                        storage.complete(claim, None)

                return started, complete

            out: dict[str, Any] = {"n": args.n, "shards": SHARDS}
            for kind, queue in (("dep-local", SHARD0B), ("dep-cross", SHARD1)):
                tag = kind
                firsts = [
                    executor.submit("demo.noop", None, task_id=f"{tag}-a{i}", queue=SHARD0)
                    for i in range(args.n)
                ]

                def submit_dependents(tag: str = tag, queue: str = queue) -> None:
                    for i in range(args.n):
                        executor.submit(
                            "demo.noop",
                            None,
                            task_id=f"{tag}-b{i}",
                            queue=queue,
                            depends_on=[f"{tag}-a{i}"],
                        )

                row = {"submit": measure(submit_dependents)}
                _, complete = end_each(SHARD0, len(firsts))
                row["end"] = measure(complete)
                out[kind] = row
                _drain(storage, queue, args.n)
            for kind, queue in (("batch-local", SHARD0), ("batch-cross", SHARD1)):
                members = [
                    TaskSubmitRequest("demo.noop", None, task_id=f"{kind}-m{i}", queue=queue)
                    for i in range(args.n)
                ]
                callback = TaskSubmitRequest("demo.noop", None, task_id=f"{kind}-cb", queue=queue)

                def submit_batch(
                    members: list[TaskSubmitRequest] = members,
                    callback: TaskSubmitRequest = callback,
                    kind: str = kind,
                ) -> None:
                    executor.submit_batch(members, batch_id=kind, on_complete=callback)

                row = {"submit": measure(submit_batch)}
                _, complete = end_each(queue, args.n)
                row["end"] = measure(complete)
                batch = executor.get_batch(kind)
                assert batch is not None and batch.completed == args.n, batch
                assert storage.get(f"{kind}-cb") is not None
                out[kind] = row
                _drain(storage, queue, 1)
            print(json.dumps(out))
            storage.close()
            admin.close()
        finally:
            server.stop()


def _cpu(admin: Any) -> float:
    info = admin.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _drain(storage: Any, queue: str, count: int) -> None:
    """Complete what the step released (dependents, a callback), unmeasured."""
    done = 0
    while done < count:
        claims = storage.claim("bench", [queue], 500, LEASE)
        if not claims:
            raise AssertionError(f"{count - done} tasks of {queue} were not released")
        started = [c for c in storage.start_many(claims, LEASE) if c is not None]
        storage.complete_many([(c, None) for c in started])
        done += len(started)


if __name__ == "__main__":
    main()
