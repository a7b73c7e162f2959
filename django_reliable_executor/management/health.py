"""What ``manage.py executor health`` checks, and the one line it prints (docs/command.md)."""

from __future__ import annotations

import dataclasses

from django.db import DatabaseError

from ..conf import ExecutorSettings
from ..exceptions import StorageUnavailableError
from ..service.reliable_executor import ReliableExecutor
from .output import format_age, where_text
from .tables import tables_missing


@dataclasses.dataclass(frozen=True)
class Health:
    """The probe's verdict: ``line`` says what was checked and what failed, on one line."""

    healthy: bool
    line: str


def default_max_age(settings: ExecutorSettings) -> float:
    """--max-age when not given: LEASE_TIMEOUT. Heartbeats come every LEASE_TIMEOUT / 4, so
    that is four missed in a row, and a worker silent that long has let its leases lapse: its
    tasks are recovered and run elsewhere, it no longer does its work."""
    return settings.LEASE_TIMEOUT


def check_health(service: ReliableExecutor, worker_id: str | None, max_age: float) -> Health:
    """Read the master lock (and ``worker_id``'s last heartbeat) once. Never raises for a
    storage that cannot be reached or used: that is the probe's answer, not a traceback."""
    where = where_text(service.storage.location())
    try:
        master = service.master()
        seen = service.storage.worker_last_seen(worker_id) if worker_id is not None else None
    except StorageUnavailableError as exc:
        return _unhealthy(f"storage does not answer ({where}): {exc}")
    except DatabaseError as exc:
        missing = tables_missing(service.storage)
        if missing is not None:
            return _unhealthy(missing)
        return _unhealthy(f"storage does not answer ({where}): {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a probe answers with a line, whatever went wrong
        return _unhealthy(f"storage check failed ({where}): {type(exc).__name__}: {exc}")
    now = service.clock.now()  # read after the store, so no heartbeat read lies in the future
    passed = [f"storage answers ({where})"]
    failed = []
    if master is None:
        failed.append("no master holds the lock")
    else:
        passed.append(f"master held by {master}")
    if worker_id is not None:
        if seen is None:
            failed.append(
                f"worker {worker_id} has no heartbeat on record (not running under that "
                "--worker-id, stopped, or forgotten after a long silence)"
            )
        else:
            age = (now - seen).total_seconds()
            heard = f"worker {worker_id} heartbeated {format_age(age)} ago"
            if age > max_age:
                failed.append(f"{heard}, more than --max-age {max_age:g}s")
            else:
                passed.append(heard)
    if failed:
        return _unhealthy(f"{'; '.join(failed)} (checked: {', '.join(passed)})")
    return Health(True, "ok: " + ", ".join(passed))


def _unhealthy(text: str) -> Health:
    # Driver messages span lines (psycopg's do): a probe's output is one line.
    return Health(False, "unhealthy: " + " ".join(text.split()))
