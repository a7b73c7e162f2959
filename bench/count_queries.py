#!/usr/bin/env python
"""Profiling aid: run ``manage.py runexecutor`` with every database call counted.

    python bench/count_queries.py OUT.json runexecutor [runexecutor options]

Started by ``throughput.py --count-queries OUT.json`` (which sets the environment). When the
worker exits it writes OUT.json with:

* ``statements``: SQL statements the ORM/storage executed, by normalised text, with the total
  seconds spent in them (a statement's time includes its round trip);
* ``round_trips``: client/server exchanges seen at the driver (statements plus BEGIN, COMMIT,
  ROLLBACK and autocommit switches; MySQLdb and psycopg only);
* ``connections``: connections opened, by thread kind, with the seconds spent opening them.

The counting itself costs time: use it to see what a task costs, not to quote throughput.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_lock = threading.Lock()
statements: Counter[str] = Counter()
statement_seconds: defaultdict[str, float] = defaultdict(float)
round_trips: Counter[str] = Counter()
connections: Counter[str] = Counter()
connect_seconds: defaultdict[str, float] = defaultdict(float)

_IN_LIST = re.compile(r"\(\s*%s(?:\s*,\s*%s)*\s*\)")
_SPACES = re.compile(r"\s+")


def normalise(sql: str) -> str:
    text = _SPACES.sub(" ", _IN_LIST.sub("(...)", sql)).strip()
    text = re.sub(r"`|\"", "", text)
    return text[:110]


def thread_kind() -> str:
    """reliable-executor-3 -> reliable-executor (pool), MainThread -> claim loop, ..."""
    name = threading.current_thread().name
    return re.sub(r"-\d+$", "", name)


def count_statement(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
    start = time.perf_counter()
    try:
        return execute(sql, params, many, context)
    finally:
        key = normalise(sql)
        with _lock:
            statements[key] += 1
            statement_seconds[key] += time.perf_counter() - start


def install() -> None:
    from django.db.backends.base.base import BaseDatabaseWrapper

    original_init = BaseDatabaseWrapper.__init__
    original_connect = BaseDatabaseWrapper.connect

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.execute_wrappers.append(count_statement)

    def connect(self: Any) -> None:
        start = time.perf_counter()
        try:
            original_connect(self)
        finally:
            kind = thread_kind()
            with _lock:
                connections[kind] += 1
                connect_seconds[kind] += time.perf_counter() - start

    BaseDatabaseWrapper.__init__ = __init__  # type: ignore[method-assign]
    BaseDatabaseWrapper.connect = connect  # type: ignore[method-assign]

    def counted(owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            with _lock:
                round_trips[label] += 1
            return original(self, *args, **kwargs)

        setattr(owner, name, wrapper)

    try:
        import MySQLdb.connections

        mysql = MySQLdb.connections.Connection
        counted(mysql, "query", "query")
        counted(mysql, "commit", "commit")
        counted(mysql, "rollback", "rollback")
        original_autocommit = mysql.autocommit

        def autocommit(self: Any, on: bool) -> None:
            if self.get_autocommit() != bool(on):  # mysqlclient skips a no-op switch
                with _lock:
                    round_trips["set autocommit"] += 1
            original_autocommit(self, on)

        mysql.autocommit = autocommit  # type: ignore[method-assign]
    except ImportError:
        pass
    try:
        import psycopg

        # Every exchange (execute, BEGIN, COMMIT, ROLLBACK) runs one generator through wait().
        counted(psycopg.Connection, "wait", "exchange")
    except ImportError:
        pass


def dump(path: str) -> None:
    with _lock:
        data = {
            "pid": os.getpid(),
            "statements": {
                sql: {"count": n, "seconds": round(statement_seconds[sql], 4)}
                for sql, n in statements.most_common()
            },
            "round_trips": dict(round_trips),
            "connections": {
                kind: {"count": n, "seconds": round(connect_seconds[kind], 4)}
                for kind, n in connections.most_common()
            },
        }
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = sys.argv.pop(1)
    for path in (str(ROOT / "testproject"), str(ROOT)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    install()
    atexit.register(dump, out)
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
