"""What ``manage.py executor`` prints: durations, ages, tables, and the JSON documents of
``status --json`` and ``show --json`` (their shapes are documented in docs/command.md)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.progress import Progress, progress_summary
from ..core.queries import KeyUse, RateUse
from ..core.records import TaskInfo, WorkerInfo
from ..core.states import TaskStatus
from ..core.waits import wait_text

# Units of --older-than, in seconds.
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION_EXAMPLES = "90s, 30m, 12h, 7d, 2w or 1d12h"
# Longer than any retention anyone means, and short enough that now minus it is a valid date.
MAX_DURATION = dt.timedelta(days=100 * 365)
_DURATION = re.compile(r"(?:\d+[smhdw])+")
_DURATION_PART = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str) -> dt.timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` or a sum like ``1d12h`` -> timedelta.
    Raises ValueError naming the value."""
    value = text.strip().lower()
    if not _DURATION.fullmatch(value):
        raise ValueError(f"invalid duration {text!r}: expected e.g. {DURATION_EXAMPLES}")
    seconds = sum(int(n) * DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(value))
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"invalid duration {text!r}: longer than {MAX_DURATION.days}d")
    return dt.timedelta(seconds=seconds)


def format_age(seconds: float) -> str:
    """A short human age: ``4.2s``, ``42s``, ``5m 07s``, ``3h 05m``, ``12d 04h``."""
    seconds = max(seconds, 0.0)  # another host's clock may run slightly ahead
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"


def iso(moment: dt.datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _seconds(moment: dt.datetime | None, now: dt.datetime) -> float | None:
    return round((now - moment).total_seconds(), 3) if moment is not None else None


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], numeric: set[int]) -> str:
    """Plain-text columns; the columns whose index is in ``numeric`` are right-aligned."""
    cells = [list(headers), *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def where_text(location: Mapping[str, str]) -> str:
    """A storage's ``location()`` in words: "database 'default'", "redis, key prefix 'x'"."""
    if "key_prefix" in location:
        return f"{location['backend']}, key prefix {location['key_prefix']!r}"
    return f"database {location.get('database_alias', '')!r}"


# -- status --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StatusReport:
    """Everything ``executor status`` shows, read once."""

    checked_at: dt.datetime
    storage: dict[str, str]
    queues: Mapping[str, Mapping[TaskStatus, int]]
    oldest_due_at: dt.datetime | None
    master: str | None
    workers: Sequence[WorkerInfo]
    lease_timeout: float
    schedules: Mapping[str, int] = dataclasses.field(
        default_factory=lambda: {"active": 0, "paused": 0}
    )
    next_schedule_at: dt.datetime | None = None
    paused_queues: frozenset[str] = frozenset()
    rate_limits: Sequence[RateUse] = ()
    key_limits: Sequence[KeyUse] = ()

    @property
    def counts(self) -> dict[TaskStatus, int]:
        totals = {status: 0 for status in TaskStatus}
        for counts in self.queues.values():
            for status, n in counts.items():
                totals[status] += n
        return totals

    def as_json(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "checked_at": iso(self.checked_at),
            "storage": self.storage,
            "counts": {status.value: counts[status] for status in TaskStatus},
            "total": sum(counts.values()),
            "queues": {
                queue: {status.value: by_status.get(status, 0) for status in TaskStatus}
                for queue, by_status in sorted(self.queues.items())
            },
            "paused_queues": sorted(self.paused_queues),
            "oldest_due_at": iso(self.oldest_due_at),
            "oldest_due_age_seconds": _seconds(self.oldest_due_at, self.checked_at),
            "schedules": {
                "active": self.schedules["active"],
                "paused": self.schedules["paused"],
                "next_run_at": iso(self.next_schedule_at),
            },
            "rate_limits": [
                {
                    "task_name": use.task_name,
                    "limit": str(use.limit),
                    "started": use.started,
                    "busiest_key": use.busiest,
                    "keys": use.keys,
                    "held_back": use.held_back,
                }
                for use in self.rate_limits
            ],
            "concurrency_keys": [
                {
                    "task_name": use.task_name,
                    "max_concurrency_per_key": use.cap,
                    "held": use.held,
                    "keys": use.keys,
                    "busiest": [{"key": key, "held": held} for key, held in use.busiest],
                }
                for use in self.key_limits
            ],
            "master": self.master,
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "hostname": w.hostname,
                    "pid": w.pid,
                    "queues": list(w.queues),
                    "started_at": iso(w.started_at),
                    "last_seen_at": iso(w.last_seen_at),
                    "last_seen_seconds_ago": _seconds(w.last_seen_at, self.checked_at),
                }
                for w in self.workers
            ],
        }

    def _schedules_line(self) -> str:
        active, paused = self.schedules["active"], self.schedules["paused"]
        if not active and not paused:
            return "Schedules: none"
        line = f"Schedules: {active} active, {paused} paused"
        if self.next_schedule_at is not None:
            wait = (self.next_schedule_at - self.checked_at).total_seconds()
            when = f"in {format_age(wait)}" if wait >= 0 else f"{format_age(-wait)} late"
            line += f"; next run {when} ({iso(self.next_schedule_at)})"
        return line

    def _rate_lines(self) -> list[str]:
        """The use of each rate limit: starts in its last window, all keys and the busiest."""
        if not self.rate_limits:
            return []
        rows = [
            [
                u.task_name,
                str(u.limit),
                u.started,
                f"{u.busiest}/{u.limit.count}",
                u.keys,
                u.held_back,
            ]
            for u in self.rate_limits
        ]
        headers = ["task name", "limit", "started", "busiest key", "keys", "held back"]
        lines = [f"Rate limits ({len(rows)}):"]
        lines.extend("  " + line for line in table(headers, rows, numeric={2, 4, 5}).splitlines())
        return lines

    def _key_lines(self) -> list[str]:
        """The use of each max_concurrency_per_key: tasks held with a key, keys, the busiest."""
        if not self.key_limits:
            return []
        rows = [
            [
                u.task_name,
                u.cap,
                u.held,
                u.keys,
                ", ".join(f"{key} {held}/{u.cap}" for key, held in u.busiest) or "-",
            ]
            for u in self.key_limits
        ]
        headers = ["task name", "per key", "held", "keys", "busiest keys"]
        lines = [f"Concurrency keys ({len(rows)}):"]
        lines.extend("  " + line for line in table(headers, rows, numeric={1, 2, 3}).splitlines())
        return lines

    def as_text(self) -> str:
        if self.storage["backend"] == "redis":
            where = f"redis, key prefix {self.storage['key_prefix']!r}"
        else:
            where = f"database, alias {self.storage['database_alias']!r}"
        lines = [f"Storage: {where} (at {iso(self.checked_at)})", ""]
        if self.queues:
            statuses = list(TaskStatus)
            rows: list[list[object]] = [
                [queue, *(by_status.get(s, 0) for s in statuses), sum(by_status.values())]
                for queue, by_status in sorted(self.queues.items())
            ]
            counts = self.counts
            rows.append(["(all)", *(counts[s] for s in statuses), sum(counts.values())])
            headers = ["queue", *(s.value for s in statuses), "total"]
            lines.append(table(headers, rows, numeric=set(range(1, len(headers)))))
        else:
            lines.append("No tasks.")
        lines.append("")
        paused = ", ".join(sorted(self.paused_queues)) or "none"
        lines.append(f"Paused queues: {paused}")
        if self.oldest_due_at is None:
            lines.append("Oldest due task: none waiting")
        else:
            age = format_age((self.checked_at - self.oldest_due_at).total_seconds())
            lines.append(f"Oldest due task: waiting {age} (due since {iso(self.oldest_due_at)})")
        lines.append(self._schedules_line())
        lines.extend(self._rate_lines())
        lines.extend(self._key_lines())
        lines.append(f"Master: {self.master or 'none'}")
        if not self.workers:
            lines.append("Workers: none")
            return "\n".join(lines)
        lines.append(f"Workers ({len(self.workers)}):")
        rows = []
        for w in self.workers:
            silent = (self.checked_at - w.last_seen_at).total_seconds()
            seen = f"{format_age(silent)} ago"
            if silent > self.lease_timeout:
                seen += " (silent: no heartbeat within LEASE_TIMEOUT)"
            rows.append([w.worker_id, w.hostname, w.pid, ",".join(w.queues), seen])
        workers = table(["worker id", "host", "pid", "queues", "last seen"], rows, numeric={2})
        lines.extend("  " + line for line in workers.splitlines())
        return "\n".join(lines)


# -- show ----------------------------------------------------------------------------------
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def _when(moment: dt.datetime | None, now: dt.datetime) -> str:
    if moment is None:
        return "-"
    seconds = (now - moment).total_seconds()
    relative = f"{format_age(seconds)} ago" if seconds >= 0 else f"in {format_age(-seconds)}"
    return f"{moment.isoformat()} ({relative})"


def progress_text(progress: Progress | None, now: dt.datetime) -> str:
    """``3 of 10 (30%): copying, at 2026-… (2s ago)``; ``-`` before any report."""
    if progress is None:
        return "-"
    return f"{progress_summary(progress)}, at {_when(progress['updated_at'], now)}"


def task_text(info: TaskInfo, now: dt.datetime) -> str:
    """Every field of the task, one a line, then the parameter, result and last error in full."""
    duration = "-"
    if info.started_at is not None and info.finished_at is not None:
        duration = format_age((info.finished_at - info.started_at).total_seconds())
    fields: list[tuple[str, object]] = [
        ("task_id", info.task_id),
        ("task_name", info.task_name),
        ("status", info.status.value),
        ("queue", info.queue),
        ("priority", info.priority),
        ("attempts", info.attempts),
        ("resumptions", info.resumptions),
        ("retry_limit", info.retry_limit),
        ("retry_interval", f"{info.retry_interval} ms"),
        ("retry_backoff", info.retry_backoff),
        (
            "max_duration_millis",
            "none" if info.max_duration_millis is None else f"{info.max_duration_millis} ms",
        ),
        (
            "attempt_timeout",
            "none" if info.attempt_timeout is None else f"{info.attempt_timeout:g} s",
        ),
        ("created_at", _when(info.created_at, now)),
        ("run_at", _when(info.run_at, now)),
        ("started_at", _when(info.started_at, now)),
        ("finished_at", _when(info.finished_at, now)),
        ("last run took", duration),
        ("worker_id", info.worker_id or "-"),
        ("cancel_requested", "yes" if info.cancel_requested else "no"),
        ("handler_running", "yes" if info.handler_running else "no"),
        ("progress", progress_text(info.progress, now)),
        ("depends_on", ", ".join(info.depends_on) or "-"),
        ("waiting_for", ", ".join(info.waiting_for) or "-"),
        # A durable wait (context.sleep, wait_for_event, wait_for).
        ("waiting", wait_text(info.waiting)),
        # The submitter's trace: its traceparent holds the trace id to look the spans up by.
        ("trace_context", _trace_text(info.trace_context)),
        ("batch_id", info.batch_id or "-"),
        ("concurrency_key", info.concurrency_key or "-"),
        ("rate_key", info.rate_key or "-"),
        ("tags", ", ".join(info.tags) or "-"),
        # The durable steps stored, in the order they finished.
        ("steps", ", ".join(step.name for step in info.steps) or "-"),
    ]
    width = max(len(name) for name, _ in fields)
    lines = [f"{name.ljust(width)}  {value}" for name, value in fields]
    for name, block in (
        ("parameter", pretty_json(info.parameter)),
        ("result", pretty_json(info.result)),
        ("last_error", info.last_error if info.last_error else "(none)"),
    ):
        lines.extend(["", f"{name}:"])
        lines.extend("  " + line for line in block.rstrip("\n").splitlines())
    return "\n".join(lines)


def _trace_text(trace_context: dict[str, str] | None) -> str:
    """``traceparent 00-<trace id>-<span id>-<flags>`` (and its tracestate), or ``none``."""
    if not trace_context:
        return "none"
    return " ".join(f"{key} {value}" for key, value in sorted(trace_context.items()))
