"""runexecutor with overlap="skip": a handler slower than its schedule's interval never has two
runs at once, read from the handler's own start and end records."""

from __future__ import annotations

import datetime as dt

from django.utils import timezone

from django_reliable_executor import TaskStatus
from tests.conftest import require
from tests.support.journal import Journal
from tests.support.processes import FAST, Backend, service_for, wait_until

RUNS = 3  # runs that must complete
SLEEP = 2.5  # seconds each run takes: more than two intervals of 1 s


def test_a_slow_run_is_never_overlapped_by_the_next(alias, key_prefix, workers, tmp_path):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = Journal(tmp_path / "journal.jsonl")
    # Two workers, each with idle threads: nothing but the schedule keeps runs apart.
    workers.start(backend, env=journal.env(), **FAST)
    workers.start(backend, env=journal.env(), **FAST)
    wait_until(lambda: service.master() is not None, 60, "no master", logs=workers.logs)
    start = timezone.now().replace(microsecond=0) + dt.timedelta(seconds=2)
    service.schedule(
        "slow", "demo.journal", {"sleep": SLEEP}, every=1, start_at=start, overlap="skip"
    )

    def completed():
        tasks = [t for t in service.list_tasks(task_name="demo.journal", limit=100)]
        done = [t for t in tasks if t.status is TaskStatus.COMPLETED]
        return done if len(done) >= RUNS else None

    wait_until(completed, 90, f"{RUNS} runs did not complete", logs=workers.logs)
    service.pause_schedule("slow")
    records = journal.records()
    spans: dict[str, list[float]] = {}
    for record in records:
        spans.setdefault(record["task"], []).append(record["t"])
    # (start, end) of each run; one still running when read ends at infinity.
    runs = sorted(
        (times[0], times[1] if len(times) > 1 else float("inf")) for times in spans.values()
    )
    assert len(runs) >= RUNS, records
    for (_, end), (next_start, _) in zip(runs, runs[1:], strict=False):
        assert next_start >= end, f"a run started at {next_start} before {end}: {runs}"
    # Runs fell due while one was running and were skipped, not queued.
    assert service.get_schedule("slow").overlap_skipped >= 1
