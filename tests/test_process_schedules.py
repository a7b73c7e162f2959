"""runexecutor fires schedules: only the master, each planned run once, also across a failover."""

from __future__ import annotations

import datetime as dt
import time

from django.utils import timezone

from django_reliable_executor import TaskStatus

from .conftest import require
from .processes import Backend, service_for, wait_until

MASTER_TTL = 2.0
FAST = {"lease_timeout": 2.0, "master_lock_ttl": MASTER_TTL}


def _fired(service, schedule_id: str):
    return sorted(
        (t for t in service.list_tasks(limit=10_000) if t.task_id.startswith(schedule_id + "@")),
        key=lambda t: t.run_at,
    )


def test_the_master_fires_each_run_once_and_on_time(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    start = timezone.now().replace(microsecond=0) + dt.timedelta(seconds=3)
    service.schedule("beat", "demo.echo", {"n": 1}, every=1, start_at=start, misfire="catch_up")
    workers.start(backend, **FAST)
    workers.start(backend, **FAST)  # a second worker: not master, must fire nothing

    def four_completed():
        done = [t for t in _fired(service, "beat") if t.status is TaskStatus.COMPLETED]
        return done if len(done) >= 4 else None

    wait_until(four_completed, 30, "the schedule did not fire four times", logs=workers.logs)
    fired = _fired(service, "beat")
    planned = [t.run_at for t in fired]
    assert planned == [start + dt.timedelta(seconds=k) for k in range(len(planned))]
    assert len({t.task_id for t in fired}) == len(fired)
    # Fired within the master's round of the planned time, not a poll interval later.
    lags = [(t.created_at - t.run_at).total_seconds() for t in fired]
    assert max(lags) < 1.0, lags
    info = service.get_schedule("beat")
    assert info.last_task_id == fired[-1].task_id or info.last_run_at >= fired[-1].run_at


def test_a_master_failover_loses_and_repeats_no_run(alias, key_prefix, workers):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    start = timezone.now().replace(microsecond=0) + dt.timedelta(seconds=2)
    service.schedule("fo", "demo.echo", every=1, start_at=start, misfire="catch_up")
    first = workers.start(backend, **FAST)
    wait_until(
        lambda: service.storage.lock_owner("master") == first.worker_id,
        10,
        "no master",
        logs=workers.logs,
    )
    second = workers.start(backend, **FAST)
    wait_until(lambda: len(_fired(service, "fo")) >= 2, 20, "no fires", logs=workers.logs)
    first.kill()
    killed_at = time.time()
    wait_until(
        lambda: service.storage.lock_owner("master") == second.worker_id,
        MASTER_TTL + 10,
        "no new master",
        logs=workers.logs,
    )
    # Runs planned while nobody was master are caught up (misfire="catch_up").
    wait_until(
        lambda: any(t.run_at.timestamp() > killed_at + 2 for t in _fired(service, "fo")),
        20,
        "the new master does not fire",
        logs=workers.logs,
    )
    planned = [t.run_at for t in _fired(service, "fo")]
    assert planned == [start + dt.timedelta(seconds=k) for k in range(len(planned))], planned
