"""The chaos soak's reclaim bound: how late a lost worker's task may start running again."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable

# Quick tasks submitted this close to the moment a recovered task became due show how long a
# task due then waited for a pool thread (about ten of them at the soak's default rate).
BACKLOG_WINDOW_S = 0.5


@dataclasses.dataclass(frozen=True)
class Timing:
    """The settings of a run that the bound is made of, in seconds."""

    lease_timeout: float
    chores_interval: float  # the master's round
    poll_interval: float
    master_lock_ttl: float
    retry_interval: float  # the soak's handlers' retry_interval: the recovered retry's delay

    @property
    def takeover(self) -> float:
        """A lost master's successor: its lock lapses, then it settles 1.5 heartbeats before it
        recovers leases (master/loop.py)."""
        return self.master_lock_ttl + 1.5 * self.lease_timeout / 4


class Backlog:
    """How long the quick tasks (no limit, no sleep, first run) waited from their submit to
    their handler's start, by submit time: what any task due at that moment waited for a pool
    thread, once claimed (with every worker's threads busy, the claims queue up in the
    workers' local queues, QUEUE_CAPACITY, and a recovered task joins them at the back)."""

    def __init__(
        self, waits: Iterable[tuple[float, float]], faults: Iterable[tuple[float, float]] = ()
    ) -> None:
        """``waits``: (submitted, first start) of each quick task; ``faults``: (begin, end) of
        each store fault, and of each worker fault the moment it came (a kill's, a freeze's
        SIGSTOP: the claims lost are those made before it). A wait that spans a fault is left
        out: a claim lost with its worker waits for its lease, which is no measure of the
        threads' backlog (and would excuse any reclaim near it)."""
        spans = list(faults)
        pairs = sorted(
            (submitted, started)
            for submitted, started in waits
            if not any(begin <= started and end >= submitted for begin, end in spans)
        )
        self._submitted = [submitted for submitted, _ in pairs]
        self._waits = [started - submitted for submitted, started in pairs]

    def wait_around(self, moment: float, window: float = BACKLOG_WINDOW_S) -> float:
        """The longest wait of a quick task submitted within ``window`` of ``moment`` (0.0
        when none was)."""
        low = bisect.bisect_left(self._submitted, moment - window)
        high = bisect.bisect_right(self._submitted, moment + window)
        return max(self._waits[low:high], default=0.0)


@dataclasses.dataclass(frozen=True)
class Reclaim:
    """One re-execution after a lost worker, split into the storage's part and the workers'."""

    fault_at: float  # the kill or freeze of the worker that ran the earlier attempt
    recovered_by: float  # the latest time the promise lets the master recover it
    due: float  # when it became claimable again (its stored run_at, else the latest possible)
    due_known: bool  # ``due`` is the task's stored run_at, not the latest possible
    retry_delay: float  # the recovered retry's delay (the handlers' retry_interval)
    pickup: float  # how long a worker may take to claim and start it once due
    started: float  # the handler's start of the re-execution

    @property
    def seconds(self) -> float:
        """From the fault to the re-execution, less the retry's delay (what the soak reports)."""
        return self.started - self.fault_at - self.retry_delay

    @property
    def bound(self) -> float:
        """The longest ``seconds`` allowed: recovered by ``recovered_by``, then the pickup."""
        return self.recovered_by + self.pickup - self.fault_at

    @property
    def late(self) -> bool:
        return self.seconds > self.bound

    def describe(self) -> str:
        """Where the time went: the recovery (the storage's promise) and the pickup."""
        recovered = self.due - self.retry_delay - self.fault_at
        return (
            f"{'recovered' if self.due_known else 'due at the latest'} {recovered:.2f}s after "
            f"the fault (promise {self.recovered_by - self.fault_at:.2f}s), started "
            f"{self.started - self.due:.2f}s after it was due (pickup allowed {self.pickup:.2f}s)"
        )


def recovery_deadline(
    fault_at: float, restarted: float, worker_or_store_faults: Iterable[float], timing: Timing
) -> float:
    """The latest time the master recovers a task whose worker was lost at ``fault_at``:
    LEASE_TIMEOUT after it (its lease lapses) plus a chores round -- or, when a worker or store
    fault meanwhile (or just before) may have cost the master, once the next master took over
    and settled, plus a chores round."""
    master_back = max(
        (
            t + timing.takeover
            for t in worker_or_store_faults
            if fault_at - timing.takeover <= t <= restarted
        ),
        default=0.0,
    )
    return max(fault_at + timing.lease_timeout, master_back) + timing.chores_interval


def reclaim(
    fault_at: float,
    started: float,
    stored_run_at: float | None,
    worker_or_store_faults: Iterable[float],
    backlog: Backlog,
    timing: Timing,
) -> Reclaim:
    """The re-execution that began at ``started`` after its worker was lost at ``fault_at``.

    ``stored_run_at``: the task's run_at as stored once it ended, when the re-execution was its
    last attempt (the recovery wrote it: the recovery's time plus the retry's delay), else None.

    Once due, a worker claims the task within POLL_INTERVAL where nothing wakes it, then it
    waits for a pool thread as long as the tasks submitted then waited (``backlog``): with
    every thread busy, a recovered task queues like any other (the bound assumed a free
    thread before, and two workers, one of them frozen, leave none)."""
    faults = list(worker_or_store_faults)
    recovered_by = recovery_deadline(fault_at, started, faults, timing)
    latest_due = recovered_by + timing.retry_interval
    known = stored_run_at is not None and fault_at < stored_run_at <= started
    due = stored_run_at if known and stored_run_at is not None else latest_due
    pickup = timing.poll_interval + backlog.wait_around(due)
    return Reclaim(
        fault_at=fault_at,
        recovered_by=recovered_by,
        due=due,
        due_known=known,
        retry_delay=timing.retry_interval,
        pickup=pickup,
        started=started,
    )
