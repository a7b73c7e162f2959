"""Django settings of the benchmark: the test project's settings, run as production would.

``throughput.py`` points ``DJANGO_SETTINGS_MODULE`` here (for itself and for the worker it
starts) after setting the ``RE_*`` variables that choose the database. Differences from
``testproject.settings``:

* ``DEBUG = False``: with ``DEBUG = True`` Django wraps every cursor to record each query,
  which is not what a deployed worker pays.
* ``RE_BENCH_REDIS_URL`` and ``RE_BENCH_KEY_PREFIX`` (``--storage redis``) select the Redis
  storage at that URL under that key prefix.
* ``RE_BENCH_REDIS_CLUSTER=1`` (``cluster.py``): ``RE_BENCH_REDIS_URL`` is one node of a
  Redis Cluster (``REDIS_CLUSTER``); ``RE_BENCH_REDIS_SHARDS`` sets ``REDIS_SHARDS`` when given.
* ``RE_BENCH_CONN_MAX_AGE`` (optional, seconds; ``none`` = unlimited) sets ``CONN_MAX_AGE`` of
  every database alias; unset keeps Django's default (0: a connection per request/task).
* ``RE_BENCH_FINISHED_RETENTION`` (optional, seconds) sets ``FINISHED_RETENTION``: the soak
  benchmark keeps it short so the master purges finished tasks many times over a run.
"""

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import DATABASES, RELIABLE_EXECUTOR

DEBUG = False

_max_age = os.environ.get("RE_BENCH_CONN_MAX_AGE")
if _max_age:
    for _database in DATABASES.values():
        _database["CONN_MAX_AGE"] = None if _max_age.lower() == "none" else int(_max_age)

if os.environ.get("RE_BENCH_REDIS_URL"):
    RELIABLE_EXECUTOR = {
        **RELIABLE_EXECUTOR,
        "STORAGE": "redis",
        "REDIS_URL": os.environ["RE_BENCH_REDIS_URL"],
        "KEY_PREFIX": os.environ.get("RE_BENCH_KEY_PREFIX", "reliable_executor_bench"),
    }

if os.environ.get("RE_BENCH_REDIS_CLUSTER") == "1":
    RELIABLE_EXECUTOR = {**RELIABLE_EXECUTOR, "REDIS_CLUSTER": True}
if os.environ.get("RE_BENCH_REDIS_SHARDS"):
    RELIABLE_EXECUTOR = {
        **RELIABLE_EXECUTOR,
        "REDIS_SHARDS": int(os.environ["RE_BENCH_REDIS_SHARDS"]),
    }

if os.environ.get("RE_BENCH_FINISHED_RETENTION"):
    RELIABLE_EXECUTOR = {
        **RELIABLE_EXECUTOR,
        "FINISHED_RETENTION": float(os.environ["RE_BENCH_FINISHED_RETENTION"]),
    }
