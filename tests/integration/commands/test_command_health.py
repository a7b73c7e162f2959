"""``manage.py executor health`` on every storage: healthy with a master (taken through the
storage, or held by a real runexecutor), unhealthy without one, a worker's heartbeat fresh,
stale or unknown, a storage that does not answer, and bad input."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings

from django_reliable_executor.core.clock import FakeClock, system_clock
from django_reliable_executor.master.lock import MASTER_LOCK_NAME
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.service.reliable_executor import executor as module_executor
from tests.conftest import REDIS_URL
from tests.support.commands import manage, process_env
from tests.support.processes import Backend, service_for, wait_until

WORKER_INFO = {"hostname": "web1", "pid": 4242, "queues": ["default"]}


@dataclasses.dataclass
class Probe:
    code: int
    out: str
    err: str


def probe(*args: str) -> Probe:
    """call_command("executor", "health", *args): its exit code (SystemExit, as manage.py
    exits with it) and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("executor", "health", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return Probe(code, out.getvalue(), err.getvalue())


def setting(alias: str, key_prefix: str, **extra: object) -> dict[str, object]:
    if alias == "redis":
        return {"STORAGE": "redis", "REDIS_URL": REDIS_URL, "KEY_PREFIX": key_prefix, **extra}
    return {"DATABASE_ALIAS": alias, **extra}


def where(alias: str, key_prefix: str) -> str:
    return f"redis, key prefix {key_prefix!r}" if alias == "redis" else f"database {alias!r}"


def ago(make_storage, seconds: float) -> ReliableExecutor:
    """A service whose clock stands ``seconds`` back: what it records is that old."""
    clock = FakeClock(system_clock.now() - dt.timedelta(seconds=seconds))
    return ReliableExecutor(make_storage(clock), clock=clock)


# -- the master ---------------------------------------------------------------------------------
def test_healthy_when_the_storage_answers_and_a_master_holds_the_lock(now_ex, alias, key_prefix):
    assert now_ex.storage.acquire_lock(MASTER_LOCK_NAME, "w-master", 60)
    result = probe()
    assert (result.code, result.err) == (0, "")
    assert (
        result.out == f"ok: storage answers ({where(alias, key_prefix)}), master held by w-master\n"
    )


def test_unhealthy_without_a_master(now_ex, make_storage, alias, key_prefix):
    now_ex.storage.worker_seen("w1", WORKER_INFO)  # a worker alone is not enough
    result = probe()
    assert result.code == 1
    checked = f"(checked: storage answers ({where(alias, key_prefix)}))"
    assert result.out == f"unhealthy: no master holds the lock {checked}\n"
    # A lock that expired is no master either.
    assert ago(make_storage, 120).storage.acquire_lock(MASTER_LOCK_NAME, "w-gone", 60)
    assert probe().out.startswith("unhealthy: no master holds the lock")


# -- a worker's heartbeat -----------------------------------------------------------------------
def test_a_fresh_heartbeat_passes(now_ex):
    now_ex.storage.acquire_lock(MASTER_LOCK_NAME, "w-master", 60)
    now_ex.storage.worker_seen("w1", WORKER_INFO)
    result = probe("--worker-id", "w1", "--max-age", "30")
    assert result.code == 0, result
    line = result.out.rstrip("\n")
    assert line.startswith("ok: storage answers (") and ", master held by w-master, " in line
    assert line.endswith("s ago") and ", worker w1 heartbeated " in line


def test_a_stale_heartbeat_fails_against_max_age_and_the_lease_timeout(
    now_ex, make_storage, alias, key_prefix
):
    now_ex.storage.acquire_lock(MASTER_LOCK_NAME, "w-master", 60)
    ago(make_storage, 40).storage.worker_seen("w-old", WORKER_INFO)
    result = probe("--worker-id", "w-old", "--max-age", "10")
    assert result.code == 1
    assert result.out.startswith("unhealthy: worker w-old heartbeated 4")
    assert "s ago, more than --max-age 10s (checked: storage answers (" in result.out
    assert result.out.rstrip("\n").endswith("master held by w-master)")
    # Without --max-age: LEASE_TIMEOUT, 60 s here, so 40 s passes; at 30 s it does not.
    assert probe("--worker-id", "w-old").code == 0
    with override_settings(RELIABLE_EXECUTOR=setting(alias, key_prefix, LEASE_TIMEOUT=30)):
        stale = probe("--worker-id", "w-old")
        module_executor.storage.close()
    assert stale.code == 1 and "more than --max-age 30s" in stale.out, stale


def test_an_unknown_worker_fails_and_every_failure_is_on_the_one_line(now_ex):
    result = probe("--worker-id", "w-nobody")
    assert result.code == 1
    assert result.out.count("\n") == 1
    assert result.out.startswith(
        "unhealthy: no master holds the lock; worker w-nobody has no heartbeat on record ("
    )


# -- a real worker ------------------------------------------------------------------------------
def test_a_real_worker_is_healthy_until_it_stops(live, alias, key_prefix, workers):
    backend = Backend(alias, key_prefix)
    worker = workers.start(backend)
    service = service_for(backend)
    wait_until(lambda: service.master() == worker.worker_id, 30, "no master", logs=workers.logs)
    env = process_env(backend)
    healthy = manage(env, "health", "--worker-id", worker.worker_id)
    assert (healthy.returncode, healthy.stderr) == (0, ""), healthy
    assert healthy.stdout.startswith(
        f"ok: storage answers ({where(alias, key_prefix)}), master held by {worker.worker_id}, "
        f"worker {worker.worker_id} heartbeated "
    )
    worker.terminate()
    assert worker.wait(30) == 0, worker.log()
    gone = manage(env, "health", "--worker-id", worker.worker_id)
    assert (gone.returncode, gone.stderr) == (1, ""), gone
    assert gone.stdout.startswith(
        f"unhealthy: no master holds the lock; worker {worker.worker_id} has no heartbeat"
    )


# -- a storage that does not answer, bad input ---------------------------------------------------
@pytest.mark.parametrize(
    "variables,named",
    [
        ({"RE_STORAGE": "redis", "RE_REDIS_URL": "redis://127.0.0.1:1/0"}, "redis, key prefix"),
        ({"RE_DATABASE": "postgres", "RE_POSTGRES_PORT": "1"}, "database 'postgres'"),
        ({"RE_DATABASE": "mariadb", "RE_MARIADB_PORT": "1"}, "database 'mariadb'"),
        ({"RE_DATABASE": "default", "RE_SQLITE_PATH": "/nonexistent/tasks.sqlite3"}, "database"),
    ],
    ids=["redis", "postgres", "mariadb", "sqlite"],
)
def test_a_storage_that_does_not_answer_is_one_line_and_exit_1(variables, named):
    result = manage(process_env(**variables), "health", "--worker-id", "w1")
    assert (result.returncode, result.stderr) == (1, ""), result
    assert result.stdout.startswith(f"unhealthy: storage does not answer ({named}")
    assert result.stdout.count("\n") == 1 and "Traceback" not in result.stdout


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf", "soon"])
def test_bad_max_age_is_a_usage_error_naming_it(value):
    with pytest.raises(CommandError, match=f"invalid --max-age '{value}'"):
        call_command("executor", "health", "--worker-id", "w1", f"--max-age={value}")


def test_bad_worker_id_or_max_age_alone_are_usage_errors():
    for args, message in (
        (("--max-age", "5"), "--max-age applies to --worker-id"),
        (("--worker-id", ""), "--worker-id must be 1.."),
        (("--worker-id", "w 1"), "contains whitespace"),
    ):
        with pytest.raises(CommandError, match=message) as raised:
            call_command("executor", "health", *args)
        assert raised.value.returncode == 2


def test_usage_errors_of_a_real_process():
    result = manage(process_env(), "health", "--max-age", "-1")
    assert (result.returncode, result.stdout) == (2, "")
    assert "invalid --max-age '-1'" in result.stderr and "usage: " in result.stderr
