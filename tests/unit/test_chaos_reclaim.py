"""The chaos soak's reclaim bound (bench/chaos_reclaim.py): the recovery's promise, then a
pickup that counts the workers' backlog but nothing else."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "chaos_reclaim.py"
_SPEC = importlib.util.spec_from_file_location("chaos_reclaim", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
chaos_reclaim = importlib.util.module_from_spec(_SPEC)
sys.modules.setdefault("chaos_reclaim", chaos_reclaim)  # dataclasses look their module up
_SPEC.loader.exec_module(chaos_reclaim)

# The soak's settings: LEASE_TIMEOUT 10 s, a 1 s chores round, POLL_INTERVAL 0.5 s, the
# handlers' retry_interval 0.1 s. A worker lost at t = 0 is recovered by 11 s at the latest.
TIMING = chaos_reclaim.Timing(
    lease_timeout=10.0,
    chores_interval=1.0,
    poll_interval=0.5,
    master_lock_ttl=4.0,
    retry_interval=0.1,
)


def quick_tasks(wait: float, around: float = 11.0) -> list[tuple[float, float]]:
    """(submitted, started) of quick tasks submitted every 0.1 s around ``around``, each
    started ``wait`` seconds later."""
    return [(around + i / 10, around + i / 10 + wait) for i in range(-10, 11)]


def test_a_recovered_task_behind_a_busy_pool_is_within_the_bound():
    # Redis, 2026-12-06: recovered 10.9 s after the freeze (due 0.1 s later), started 0.75 s
    # after it was due, while the one live worker's quick tasks waited 0.8 s for a thread.
    found = chaos_reclaim.reclaim(
        0.0, 11.75, 11.0, [0.0], chaos_reclaim.Backlog(quick_tasks(0.8)), TIMING
    )
    assert found.seconds == pytest.approx(11.65)
    assert found.bound == pytest.approx(11.0 + 0.5 + 0.8)
    assert not found.late


def test_the_same_start_with_free_threads_is_late():
    found = chaos_reclaim.reclaim(
        0.0, 11.75, 11.0, [0.0], chaos_reclaim.Backlog(quick_tasks(0.005)), TIMING
    )
    assert found.bound == pytest.approx(11.505)
    assert found.late
    assert "started 0.75s after it was due (pickup allowed 0.51s)" in found.describe()


def test_a_late_recovery_is_late_however_quick_the_pickup():
    found = chaos_reclaim.reclaim(
        0.0, 12.6, 12.5, [0.0], chaos_reclaim.Backlog(quick_tasks(0.005, around=12.5)), TIMING
    )
    assert found.late
    assert found.describe().startswith("recovered 12.40s after the fault (promise 11.00s)")


def test_a_wait_across_a_lost_worker_is_no_backlog():
    # A quick task claimed by a worker killed at 10.95 s waited for its lease: 10 s, which must
    # not excuse a late reclaim near it.
    lost_claim = [(10.9, 22.0)]
    backlog = chaos_reclaim.Backlog(quick_tasks(0.005) + lost_claim, faults=[(10.95, 10.95)])
    assert backlog.wait_around(11.0) == pytest.approx(0.005)
    unfiltered = chaos_reclaim.Backlog(quick_tasks(0.005) + lost_claim)
    assert unfiltered.wait_around(11.0) == pytest.approx(11.1)
    assert chaos_reclaim.reclaim(0.0, 11.75, 11.0, [0.0], backlog, TIMING).late


def test_without_a_stored_run_at_the_task_is_due_at_the_latest():
    # The re-execution was not the task's last run (or its run_at came after its start): the
    # backlog is read at the latest moment the task could have been due, 11.1 s.
    backlog = chaos_reclaim.Backlog(quick_tasks(0.6, around=11.1))
    found = chaos_reclaim.reclaim(0.0, 11.9, 12.5, [0.0], backlog, TIMING)
    assert not found.due_known
    assert found.due == pytest.approx(11.1)
    assert found.bound == pytest.approx(11.0 + 0.5 + 0.6)
    assert not found.late


def test_a_lost_master_moves_the_promise_to_its_successor():
    # The master was killed 3 s after the worker: its successor takes over 4 s (its lock's
    # TTL) plus 1.5 heartbeats (3.75 s) later, then recovers within a round.
    assert chaos_reclaim.recovery_deadline(0.0, 12.0, [0.0, 3.0], TIMING) == pytest.approx(11.75)
    assert chaos_reclaim.recovery_deadline(0.0, 12.0, [0.0], TIMING) == pytest.approx(11.0)
