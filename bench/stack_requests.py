#!/usr/bin/env python
"""What a live stack request costs: the worker's poll, and how soon a request is answered.

    python bench/stack_requests.py --storage {sqlite,mariadb,postgres,redis} [--n 2000]

Measures two things (docs/workers.md, Live stacks):

* ``poll_us``: the mean wall time of one ``take_stack_requests(worker_id, 0)``, the look a
  worker running tasks makes for its requests (once a second on the databases; Redis blocks
  instead), over ``--n`` calls in this process, with 50 answered requests of other workers in
  the table: one indexed SELECT (the databases) or one LPOP (Redis), round trip included.
* ``answer_ms``: from ``executor.request_stack`` to the answer being readable through
  ``executor.task_stack`` (polled every 5 ms), for 10 requests to a real ``runexecutor`` (a
  subprocess, default settings) whose one handler sleeps, each made after a random pause of
  up to a second (so at any point of the worker's poll cycle): median and max.

Uses the benchmark's own databases (``reliable_executor_bench``, the SQLite file
``$TMPDIR/reliable_executor_stacks.sqlite3``, the Redis key prefix
``reliable_executor_stacks``) and deletes every task and stack request in them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KEY_PREFIX = "reliable_executor_stacks"


def configure(storage: str) -> str:
    """Point Django at the benchmark's store; return the database alias holding the tasks."""
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    os.environ.update(
        DJANGO_SETTINGS_MODULE="testproject.settings",
        RE_DEBUG="0",
        RE_KEY_PREFIX=KEY_PREFIX,
        RE_MARIADB_NAME="reliable_executor_bench",
        RE_POSTGRES_NAME="reliable_executor_bench",
        RE_SQLITE_PATH=str(Path(tempfile.gettempdir()) / "reliable_executor_stacks.sqlite3"),
    )
    if storage == "redis":
        os.environ["RE_STORAGE"] = "redis"
    elif storage != "sqlite":
        os.environ["RE_DATABASE"] = storage
    return storage if storage in ("mariadb", "postgres") else "default"


def poll_cost(executor, n: int) -> float:
    """Mean µs of one take_stack_requests(worker_id, 0) with nothing to take."""
    from django_reliable_executor.core.stacks import StackAnswer, StackRequest

    storage = executor.storage
    now = dt.datetime.now(dt.timezone.utc)
    for i in range(50):  # other workers' answered requests
        request = StackRequest(uuid.uuid4().hex, f"t{i}", f"other-{i}", now)
        storage.add_stack_request(request)
        storage.answer_stack(StackAnswer(request.request_id, f"t{i}", f"other-{i}", now, False))
    storage.take_stack_requests("bench-worker", 0)  # warm
    began = time.perf_counter()
    for _ in range(n):
        storage.take_stack_requests("bench-worker", 0)
    return (time.perf_counter() - began) / n * 1e6


def answer_times(executor, storage: str) -> list[float]:
    """Milliseconds from request_stack to a readable answer, 10 requests to a real worker."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'testproject'}"}
    worker = subprocess.Popen(
        [sys.executable, str(ROOT / "testproject" / "manage.py"), "runexecutor"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        task_id = executor.submit("demo.record", {"sleep": 30}).task_id
        while executor.get_task(task_id).status.value != "RUNNING":
            time.sleep(0.05)
        time.sleep(0.5)  # in its time.sleep
        times = []
        for _ in range(10):
            time.sleep(random.random())  # at any point of the worker's poll cycle
            began = time.perf_counter()
            request_id = executor.request_stack(task_id)
            while (answer := executor.task_stack(task_id, request_id)) is None:
                time.sleep(0.005)
            assert "time.sleep" in answer.stack, answer
            times.append((time.perf_counter() - began) * 1000)
        return times
    finally:
        worker.kill()
        worker.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--storage", required=True, choices=["sqlite", "mariadb", "postgres", "redis"]
    )
    parser.add_argument("--n", type=int, default=2000, help="polls timed (default 2000)")
    args = parser.parse_args()
    alias = configure(args.storage)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from django_reliable_executor import executor

    call_command("migrate", verbosity=0)  # the demo app's table, beside the tasks
    if alias != "default":
        call_command("migrate", database=alias, verbosity=0)

    def clear() -> None:
        if args.storage == "redis":
            client = executor.storage.client  # type: ignore[attr-defined]
            for key in client.scan_iter("{" + KEY_PREFIX + "}:*"):
                client.delete(key)
        else:
            with connections[alias].cursor() as cursor:
                cursor.execute("DELETE FROM reliable_executor_task")
                cursor.execute("DELETE FROM reliable_executor_stack_request")

    clear()
    poll = poll_cost(executor, args.n)
    times = answer_times(executor, args.storage)
    clear()
    result = {
        "storage": args.storage,
        "poll_us": round(poll, 1),
        "answer_ms_median": round(statistics.median(times), 1),
        "answer_ms_max": round(max(times), 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
