#!/usr/bin/env python
"""Python work per task, counted in bytecode steps: a figure a busy machine cannot disturb.

    python bench/steps.py --storage {sqlite,mariadb,postgres,redis} [--n 1000] [--code DIR]

Counts the interpreter's opcode events in every thread (``sys.settrace`` with
``f_trace_opcodes``) while it submits N ``demo.noop`` tasks one by one, submits N with
``submit_many`` (batches of 500), and drains them with an in-process ``runexecutor --burst``
(8 threads; the worker's start-up is included). Prints one JSON line of steps per task.

Rates and CPU times move 20 % or more between identical runs on a shared machine; steps move
by a few per task. To compare two versions, run it from each checkout, or point ``--code`` at
another checkout (a ``git worktree`` of the older commit) in the same sitting. Steps are not
time: C code (drivers, JSON) and the servers' work do not count, so quote them beside
throughput.py's figures, not instead of them. Tracing makes everything ~20× slower.

Uses the benchmark's own databases (``reliable_executor_bench``, the SQLite file
``$TMPDIR/reliable_executor_steps.sqlite3``, the Redis key prefix ``reliable_executor_steps``)
and deletes every task in them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEY_PREFIX = "reliable_executor_steps"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    storages = ["sqlite", "mariadb", "postgres", "redis"]
    parser.add_argument("--storage", required=True, choices=storages)
    parser.add_argument("--n", type=int, default=1000, help="tasks per phase (default 1000)")
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose code is measured")
    parser.add_argument(
        "--key-prefix",
        default=KEY_PREFIX,
        help=f"Redis key prefix of the tasks (default {KEY_PREFIX}; another one per "
        "concurrent run: each deletes every task under its own)",
    )
    return parser.parse_args()


def configure(storage: str, code: Path, key_prefix: str) -> str:
    """Point Django at the benchmark's store; return the database alias holding the tasks."""
    sys.path[:0] = [str(code), str(code / "testproject")]
    os.environ.update(
        DJANGO_SETTINGS_MODULE="testproject.settings",
        RE_DEBUG="0",
        RE_KEY_PREFIX=key_prefix,
        RE_MARIADB_NAME="reliable_executor_bench",
        RE_POSTGRES_NAME="reliable_executor_bench",
        RE_SQLITE_PATH=str(Path(tempfile.gettempdir()) / "reliable_executor_steps.sqlite3"),
    )
    if storage == "redis":
        os.environ["RE_STORAGE"] = "redis"
    elif storage != "sqlite":
        os.environ["RE_DATABASE"] = storage
    return storage if storage in ("mariadb", "postgres") else "default"


def counted(action: Callable[[], Any]) -> int:
    """Opcode events of every thread while ``action`` runs."""
    steps = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal steps
        if event == "opcode":
            steps += 1  # threads may race here; the lost counts are far below the noise
        return local

    threading.settrace(trace)
    sys.settrace(trace)
    try:
        action()
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return steps


def main() -> int:
    args = parse_args()
    alias = configure(args.storage, args.code.resolve(), args.key_prefix)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from django_reliable_executor import TaskSubmitRequest, executor

    if args.storage != "redis":
        call_command("migrate", database=alias, verbosity=0)

    def clear() -> None:
        if args.storage == "redis":
            client = executor.storage.client  # type: ignore[attr-defined]
            for key in client.scan_iter("{" + args.key_prefix + "}:*"):
                client.delete(key)
        else:
            with connections[alias].cursor() as cursor:
                cursor.execute("DELETE FROM reliable_executor_task")

    n = args.n
    clear()
    executor.submit("demo.noop")  # warm: connections, caches, imports
    clear()
    one = counted(lambda: [executor.submit("demo.noop") for _ in range(n)])
    clear()
    sizes = [min(500, n - start) for start in range(0, n, 500)]
    batches = [[TaskSubmitRequest(task_name="demo.noop") for _ in range(k)] for k in sizes]
    many = counted(lambda: [executor.submit_many(batch) for batch in batches])
    with open(os.devnull, "w") as quiet:
        drain = counted(
            lambda: call_command(
                "runexecutor", "--burst", "--core-pool-size", "8", "--max-pool-size", "8",
                stdout=quiet,
            )
        )  # fmt: skip
    clear()
    result = {"storage": args.storage, "n": n, "code": str(args.code)}
    result |= {"submit_steps": one // n, "submit_many_steps": many // n, "drain_steps": drain // n}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
