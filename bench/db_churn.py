#!/usr/bin/env python
"""What a task costs the database in writes and space: WAL (redo) bytes per task and the size
of the task table and of each of its indexes.

    python bench/db_churn.py --storage postgres --n 20000
    python bench/db_churn.py --storage mariadb  --n 20000

On a store of its own (``reliable_executor_churn``, as bench/throughput.py's), emptied first:
submits N ``demo.noop`` tasks (``submit_many``, 1 000 per call), drains them with one
``runexecutor`` (8 threads), then purges them (``executor.purge_finished``, as the master and
``executor purge`` do). For each phase it prints the write-ahead log written per task:

* PostgreSQL: the records pg_walinspect reads between two ``pg_current_wal_lsn()``, of the
  benchmark database's relations only (the server's other databases do not count), per
  relation: the table (heap), its indexes, and each index;
* MariaDB: ``Innodb_os_log_written`` deltas, the whole server's (quiet it first).

After the drain it prints the size of the table and of each index (PostgreSQL
``pg_relation_size``; MariaDB ``mysql.innodb_index_stats`` pages, after ANALYZE). The
PostgreSQL figures do not move with the machine's load: they count the row versions and index
entries each transition writes, which is what bloat and vacuum work grow with.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import throughput  # noqa: E402 - the stores and worker process of the throughput benchmark

log = throughput.log
TABLE = "reliable_executor_task"


def wal_position(store: throughput.Store) -> Any:
    """Where the server's write-ahead log is now: an LSN on PostgreSQL, the bytes of redo log
    written so far on MariaDB."""
    with store._connection().cursor() as cursor:  # type: ignore[attr-defined]
        if isinstance(store, throughput.PostgresStore):
            cursor.execute("SELECT pg_current_wal_lsn()::text")
            return cursor.fetchone()[0]
        cursor.execute("SHOW GLOBAL STATUS LIKE 'Innodb_os_log_written'")
        return int(cursor.fetchone()[-1])


def wal_written(store: throughput.Store, start: Any, end: Any) -> dict[str, int]:
    """Bytes of log written between two positions: on PostgreSQL per relation of this database
    (pg_walinspect's records, so other databases' traffic on the server does not count); on
    MariaDB the server's whole redo log, under "*"."""
    if not isinstance(store, throughput.PostgresStore):
        return {"*": end - start}
    with store._connection().cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        cursor.execute(
            "SELECT r.relname, SUM(w.record_length) FROM pg_get_wal_records_info(%s, %s) w "
            "JOIN pg_class r ON r.relfilenode = "
            "substring(w.block_ref FROM 'rel [0-9]+/[0-9]+/([0-9]+)')::oid "
            "WHERE w.block_ref LIKE %s GROUP BY r.relname",
            [start, end, f"%rel %/{database_oid(cursor)}/%"],
        )
        return {name: int(size) for name, size in cursor.fetchall()}


def updates(store: throughput.Store) -> dict[str, int] | None:
    """PostgreSQL's count of the task table's row updates so far, and how many of them were HOT
    (heap-only: no index entry written, which a fillfactor below 100 can help with)."""
    if not isinstance(store, throughput.PostgresStore):
        return None
    with store._connection().cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s",
            [TABLE],
        )
        total, hot = cursor.fetchone()
    return {"rows_updated": int(total), "hot": int(hot)}


def database_oid(cursor: Any) -> int:
    cursor.execute("SELECT oid FROM pg_database WHERE datname = current_database()")
    return int(cursor.fetchone()[0])


def per_task(written: dict[str, int], n: int, indexes: set[str]) -> dict[str, int]:
    """The log bytes per task of the task table (heap), of its indexes together, and of all;
    on MariaDB only the whole server's (``server``: other databases' writes count too)."""
    if "*" in written:
        return {"server": round(written["*"] / n)}
    heap = written.get(TABLE, 0)
    index = sum(size for name, size in written.items() if name in indexes)
    return {
        "table": round(heap / n),
        "indexes": round(index / n),
        "all": round(sum(written.values()) / n),
    }


def sizes(store: throughput.Store) -> dict[str, int]:
    """Bytes of the task table (heap) and of each of its indexes, by name."""
    with store._connection().cursor() as cursor:  # type: ignore[attr-defined]
        if isinstance(store, throughput.PostgresStore):
            cursor.execute(
                "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c "
                "WHERE c.oid = %s::regclass UNION ALL "
                "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x "
                "JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = %s::regclass",
                [TABLE, TABLE],
            )
            return {name: int(size) for name, size in cursor.fetchall()}
        cursor.execute(f"ANALYZE TABLE {TABLE}")
        cursor.fetchall()
        cursor.execute(
            "SELECT index_name, stat_value * @@innodb_page_size FROM mysql.innodb_index_stats "
            "WHERE database_name = DATABASE() AND table_name = %s AND stat_name = 'size'",
            [TABLE],
        )
        return {name: int(size) for name, size in cursor.fetchall()}


@contextlib.contextmanager
def wal_kept(store: throughput.Store) -> Iterator[None]:
    """On PostgreSQL, keep the server's write-ahead log from now on until the block ends (a
    temporary physical replication slot on a connection of its own: gone when it closes, even
    if this process dies), so that a checkpoint meanwhile cannot recycle what is read after."""
    if not isinstance(store, throughput.PostgresStore):
        yield
        return
    import psycopg

    settings = store._connection().settings_dict
    with psycopg.connect(
        host=settings["HOST"],
        port=int(settings["PORT"]),
        user=settings["USER"],
        password=settings["PASSWORD"],
        dbname=settings["NAME"],
        autocommit=True,
    ) as connection:
        connection.execute(
            "SELECT pg_create_physical_replication_slot(%s, true, true)",
            [f"rexec_churn_{os.getpid()}"],
        )
        yield


def run(args: argparse.Namespace) -> dict[str, Any]:
    store = throughput.open_store(args)
    if not isinstance(store, (throughput.PostgresStore, throughput.MariaDBStore)):
        raise throughput.BenchError("--storage: postgres or mariadb (the WAL/redo log is read)")
    with wal_kept(store):
        return measure(args, store)


def measure(args: argparse.Namespace, store: throughput.Store) -> dict[str, Any]:
    from django_reliable_executor import TaskSubmitRequest, executor

    log(f"store: {store.describe()}; code: {throughput.code_version()}")
    load_before = throughput.machine_load()
    store.clear()
    indexes = set(sizes(store)) - {TABLE}
    result: dict[str, Any] = {"storage": store.name, "n": args.n}

    start = wal_position(store)
    for offset in range(0, args.n, 1000):
        requests = [
            TaskSubmitRequest("demo.noop", None, task_id=uuid.uuid4().hex)
            for _ in range(min(1000, args.n - offset))
        ]
        executor.submit_many(requests)
    submitted = wal_position(store)
    result["wal_submit_per_task"] = per_task(wal_written(store, start, submitted), args.n, indexes)
    store.after_load()
    store.close()

    worker = throughput.WorkerProcess(args, {**os.environ, **store.environment()})
    worker.start()
    try:
        while store.unfinished():
            worker.check_alive()
            time.sleep(0.2)
    finally:
        worker.stop()
    drained = wal_position(store)
    written = wal_written(store, submitted, drained)
    result["wal_drain_per_task"] = per_task(written, args.n, indexes)
    if "*" not in written:
        result["wal_drain_per_task_by_index"] = {
            name: round(written.get(name, 0) / args.n) for name in sorted(indexes)
        }
    result["updates"] = updates(store)
    relation_sizes = sizes(store)
    table_bytes = relation_sizes.pop(TABLE, relation_sizes.pop("PRIMARY", 0))
    result["table_bytes_per_task"] = round(table_bytes / args.n)
    result["index_bytes_per_task"] = round(sum(relation_sizes.values()) / args.n)
    result["index_bytes_per_task_by_index"] = {
        name: round(size / args.n) for name, size in sorted(relation_sizes.items())
    }

    began = time.monotonic()
    purged = executor.purge_finished(executor.clock.now(), batch=500)
    result["purge_per_s"] = round(purged / (time.monotonic() - began))
    written = wal_written(store, drained, wal_position(store))
    result["wal_purge_per_task"] = per_task(written, args.n, indexes)
    result["load_before"], result["load_after"] = load_before, throughput.machine_load()
    store.clear()
    store.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    throughput.add_store_arguments(parser, "reliable_executor_churn")
    parser.add_argument("--n", type=int, default=20_000, help="tasks (default 20000)")
    parser.add_argument("--threads", type=int, default=8, help="worker pool threads")
    parser.set_defaults(count_queries=None, poll_interval=None, conn_max_age=None)
    args = parser.parse_args()
    try:
        print(json.dumps(run(args)))
    except throughput.BenchError as exc:
        sys.exit(f"db_churn: {exc}")


if __name__ == "__main__":
    main()
