"""What "ended" means (docs/guarantees.md), as a matrix under real runexecutor processes: every
way a task's status can become terminal while its handler runs on (a TIMEOUT in the thread pool,
a TIMEOUT on the event loop, a cancel of a running task, a TIMEOUT whose worker then freezes
past its lease), and an attempt past its attempt_timeout whose handler runs on (in a thread, on
the event loop: the task stays RUNNING until it returns, then FAILED), against every rule that
waits for a task to end (dependents in both ``on_dependency_failure`` modes, submitted before
and during the run; a batch's callback; a unique key; ``overlap="skip"``; ``max_concurrency``;
``retry_task``; the purge). Read from the handlers' own start and end records: nothing that
waits starts before the handler it waits for returned, unless that handler's worker is gone
(its lease lapsed)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

import pytest
from django.utils import timezone

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import BACKENDS, db_params, require
from tests.support.journal import Journal
from tests.support.processes import (
    FAST,
    LEASE,
    Backend,
    WorkerProcess,
    peak_overlap,
    service_for,
    wait_until,
)

HOLD = 2.5  # seconds each first handler runs: well past its deadline
DEADLINE_MILLIS = 400
# Room for every case of one ending at once, in one worker.
POOL = ("--core-pool-size", "12", "--max-pool-size", "12", "--queue-capacity", "24")
FROZEN = "frozen"  # the queue of the worker that is frozen (lease_lost)


@dataclasses.dataclass(frozen=True)
class Ending:
    """One way a task becomes terminal while its handler runs."""

    name: str
    handler: str  # the handler of the tasks that outlive their attempt
    deadline: bool  # submitted with max_duration_millis
    cancel: bool  # the test cancels them once they run
    freeze: bool  # their worker is frozen (SIGSTOP) past its lease once they timed out
    # Submitted with this attempt_timeout (seconds; no retries: they end FAILED once the
    # handler returned), which their handlers run past.
    attempt_timeout: float | None = None

    def first(self, task_id: str, **options) -> TaskSubmitRequest:
        parameter = {"seconds": HOLD, "fail": self.cancel, **options.pop("parameter", {})}
        if self.deadline:
            options.setdefault("max_duration_millis", DEADLINE_MILLIS)
        if self.attempt_timeout is not None:
            options.setdefault("attempt_timeout", self.attempt_timeout)
        if self.freeze:
            options.setdefault("queue", FROZEN)
        return TaskSubmitRequest(
            options.pop("task_name", self.handler), parameter, task_id=task_id, **options
        )


ENDINGS = {
    "timeout": Ending("timeout", "demo.outlive", deadline=True, cancel=False, freeze=False),
    "timeout_async": Ending(
        "timeout_async", "demo.async_outlive", deadline=True, cancel=False, freeze=False
    ),
    "cancel": Ending("cancel", "demo.outlive", deadline=False, cancel=True, freeze=False),
    "lease_lost": Ending("lease_lost", "demo.outlive", deadline=True, cancel=False, freeze=True),
    "attempt_timeout": Ending(
        "attempt_timeout",
        "demo.outlive",
        deadline=False,
        cancel=False,
        freeze=False,
        attempt_timeout=DEADLINE_MILLIS / 1000,
    ),
    "attempt_timeout_async": Ending(
        "attempt_timeout_async",
        "demo.async_outlive",
        deadline=False,
        cancel=False,
        freeze=False,
        attempt_timeout=DEADLINE_MILLIS / 1000,
    ),
}


def follower(task_id: str, **options) -> TaskSubmitRequest:
    """A quick task whose start the journal records (demo.journal)."""
    return TaskSubmitRequest("demo.journal", {}, task_id=task_id, **options)


class Matrix:
    """One ending's cases, run at once; the journal says what ran when."""

    def __init__(self, ending: Ending, service: ReliableExecutor, journal: Journal, logs) -> None:
        self.ending = ending
        self.service = service
        self.journal = journal
        self.logs = logs
        self.firsts = ["dep-run", "dep-cancel", "dep-late", "batch", "unique", "retry", "purge"]
        self.firsts.append("capped")
        self.frozen_at: float | None = None
        self.failures: list[str] = []  # "feature: what went wrong", every one of the run

    def expect(self, feature: str, ok: bool, detail: object) -> None:
        """A verdict of one cell of the matrix: collected, so that one run reports them all."""
        if not ok:
            self.failures.append(f"{self.ending.name} x {feature}: {detail}")

    # -- the journal ------------------------------------------------------------------------
    def times(self, task: str, event: str) -> list[float]:
        return [r["t"] for r in self.journal.records() if (r["task"], r["event"]) == (task, event)]

    def starts(self, task: str) -> list[float]:
        return self.times(task, "start")

    def ends(self, task: str) -> list[float]:
        return self.times(task, "end")

    def first_end(self, task: str) -> float:
        """When the first run of ``task`` returned (infinity while it has not: its worker is
        frozen); for lease_lost, half a lease after its worker froze instead: renewed every
        LEASE / 4, its lease lasted at least that long, and only its lapse ends the task."""
        if self.ending.freeze:
            assert self.frozen_at is not None
            return self.frozen_at + LEASE / 2
        ends = self.ends(task)
        return ends[0] if ends else float("inf")

    # -- the run ----------------------------------------------------------------------------
    def submit(self) -> None:
        e, service = self.ending, self.service
        service.submit_many(
            [
                e.first("dep-run"),
                follower("dep-run-after", depends_on=["dep-run"], on_dependency_failure="run"),
                e.first("dep-cancel"),
                follower("dep-cancel-after", depends_on=["dep-cancel"]),
                # Starts once dep-cancel-after ended (CANCELLED, unless dep-cancel completed).
                follower(
                    "dep-cancel-next", depends_on=["dep-cancel-after"], on_dependency_failure="run"
                ),
                e.first("dep-late"),
                e.first("unique", unique_for=60, unique_key="matrix"),
                e.first("retry", parameter={"first_only": True}),
                e.first("purge"),
                e.first("capped", task_name=f"{e.handler}_capped"),
            ]
        )
        service.submit_batch(
            [e.first("batch")], batch_id="matrix", on_complete=follower("batch-callback")
        )
        start = timezone.now().replace(microsecond=0) + dt.timedelta(seconds=1)
        service.schedule(
            "overlap",
            e.handler,
            {"seconds": HOLD, "fail": e.cancel},
            every=1,
            start_at=start,
            overlap="skip",
            queue=FROZEN if e.freeze else None,
            max_duration_millis=DEADLINE_MILLIS if e.deadline else None,
        )

    def in_window(self, task_id: str) -> bool:
        """The task's status is what its ending makes it while the handler still runs."""
        info = self.service.get_task(task_id)
        if info is None or not self.starts(task_id) or self.ends(task_id):
            return False
        limit = self.ending.attempt_timeout
        if limit is not None:  # past its limit (and a margin), still RUNNING: not ended
            past = time.time() - self.starts(task_id)[0] > limit + 0.3
            return past and info.status is TaskStatus.RUNNING
        if self.ending.cancel:
            if info.status is TaskStatus.RUNNING and not info.cancel_requested:
                self.service.cancel_task(task_id)
            return info.status is TaskStatus.RUNNING and info.cancel_requested
        return info.status is TaskStatus.TIMEOUT

    def during(self) -> None:
        """While every first handler still runs on: what must wait, or be refused."""
        service = self.service
        wait_until(
            lambda: all(self.in_window(t) for t in self.firsts),
            30,
            "the first tasks did not all reach their ending while running",
            logs=self.logs,
        )
        for task_id in self.firsts:
            info = service.get_task(task_id)
            self.expect("handler_running", info.handler_running, info)
        late = service.submit_task(
            follower("dep-late-after", depends_on=["dep-late"], on_dependency_failure="run")
        )
        waits = late.status is TaskStatus.CREATED and late.waiting_for == ("dep-late",)
        self.expect("depends_on submitted during the run", waits, late)
        again = service.submit_task(
            self.ending.first("unique-again", unique_for=60, unique_key="matrix")
        )
        # The holder has not ended: the submit returns it and stores nothing.
        self.expect("unique_for", again.task_id == "unique", again)
        reason = service.retry_task_or_reason("retry")
        if self.ending.attempt_timeout is not None:  # RUNNING until its handler returns
            self.expect("retry_task", reason == "RUNNING cannot be retried", reason)
        elif not self.ending.cancel:  # (a RUNNING task cannot be retried at all)
            self.expect("retry_task", reason is not None and "still running" in reason, reason)
        service.purge_finished(timezone.now() + dt.timedelta(days=1))
        if not self.ends("purge"):
            kept = service.get_task("purge") is not None
            self.expect("purge", kept, "purged while its handler runs")
        capped = f"{self.ending.handler}_capped"  # the name of "capped", at max_concurrency=1
        service.submit_task(TaskSubmitRequest(capped, {}, task_id="capped-after"))

    def finish(self, frozen: WorkerProcess | None) -> None:
        """Until everything that waited has run."""
        service = self.service
        if frozen is not None:
            # Frozen while it runs a schedule run, so that run holds the next ones back: a run
            # fired just before the freeze and never started would time out unclaimed, ended,
            # and the next would rightly fire at once.
            wait_until(self.schedule_run_holding, 30, "no schedule run started", logs=self.logs)
            self.frozen_at = time.time()
            frozen.popen.send_signal(19)  # SIGSTOP: its leases lapse, its handlers stay unfinished
        waited = ["dep-run-after", "dep-cancel-next", "dep-late-after", "batch-callback"]
        waited.append("capped-after")

        def retried() -> bool:
            return self.ending.cancel or service.retry_task_or_reason("retry") is None

        wait_until(retried, 30, "retry_task was never accepted", logs=self.logs)
        wait_until(
            lambda: all(self.ends(t) for t in waited),
            45,
            f"not everything that waits ran: {[t for t in waited if not self.ends(t)]}",
            logs=self.logs,
        )
        wait_until(
            lambda: self.overlap_runs() >= 2,
            30,
            "the schedule did not fire twice",
            logs=self.logs,
        )
        self.service.pause_schedule("overlap")
        if not self.ending.cancel:
            wait_until(
                lambda: len(self.starts("retry")) >= 2 or self.ending.freeze,
                30,
                "the retried task did not run",
                logs=self.logs,
            )

        def running() -> list[str]:
            return [t for t in self.firsts if service.get_task(t).handler_running]

        try:
            wait_until(lambda: not running(), 15, "")
        except AssertionError:
            self.expect("handler_running", False, f"still counted as running: {running()}")

    def schedule_run_holding(self) -> bool:
        """A run of the schedule has started and not returned (its handler holds the task)."""
        return any(start and not end for start, end in self._schedule_records())

    def _schedule_records(self) -> list[tuple[list[float], list[float]]]:
        runs = self.service.list_tasks(task_name=self.ending.handler, limit=100)
        return [
            (self.starts(info.task_id), self.ends(info.task_id))
            for info in runs
            if info.task_id not in self.firsts and info.task_id != "unique-again"
        ]

    def overlap_runs(self) -> int:
        """How many runs the schedule fired (tasks stored), or for a cancel, started."""
        runs = [t for t in self.service.list_tasks(task_name=self.ending.handler, limit=100)]
        return len([t for t in runs if t.task_id not in self.firsts])

    # -- the verdict ------------------------------------------------------------------------
    def check(self) -> None:
        pairs = [
            ("depends_on run", "dep-run-after", "dep-run"),
            ("depends_on cancel", "dep-cancel-next", "dep-cancel"),
            ("depends_on submitted during the run", "dep-late-after", "dep-late"),
            ("batch on_complete", "batch-callback", "batch"),
            ("max_concurrency", "capped-after", "capped"),
        ]
        for feature, later, first in pairs:
            started, ended = self.starts(later)[0], self.first_end(first)
            detail = f"{later} started at {started}, {first} ended at {ended}"
            self.expect(feature, started >= ended, detail)
        after = self.service.get_task("dep-cancel-after")
        self.expect("depends_on cancel", after.status is TaskStatus.CANCELLED, after)
        if not self.ending.cancel and not self.ending.freeze:
            retried, ends = self.starts("retry"), self.ends("retry")
            ok = len(retried) == 2 and retried[1] >= ends[0]
            self.expect("retry_task", ok, f"runs started at {retried}, the first ended at {ends}")
        # The schedule's runs never overlap (with lease_lost a run may start once the frozen
        # worker's lease lapsed: its handler counts as gone).
        runs = self.schedule_runs()
        if not self.ending.freeze:
            self.expect("overlap=skip", peak_overlap(runs) == 1, f"runs (start, end): {runs}")
        else:
            assert self.frozen_at is not None
            # Its runs wait for the frozen worker: when the next one was fired says it all.
            fired = sorted(
                info.created_at.timestamp()
                for info in self.service.list_tasks(task_name=self.ending.handler, limit=100)
                if info.task_id not in self.firsts
            )
            early = [at for at in fired[1:] if at < self.frozen_at + LEASE / 2]
            self.expect("overlap=skip", not early, f"fired {fired}, frozen at {self.frozen_at}")
        # Ended now (for lease_lost: its worker is gone): the purge takes it.
        self.service.purge_finished(timezone.now() + dt.timedelta(days=1))
        self.expect("purge", self.service.get_task("purge") is None, "kept once ended")

    def schedule_runs(self) -> list[tuple[float, float]]:
        runs = []
        for info in self.service.list_tasks(task_name=self.ending.handler, limit=100):
            if info.task_id in self.firsts or info.task_id == "unique-again":
                continue
            starts, ends = self.starts(info.task_id), self.ends(info.task_id)
            if starts:
                runs.append((starts[0], ends[0] if ends else float("inf")))
        return sorted(runs)


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_nothing_that_waits_for_an_ending_starts_before_the_handler_returned(
    alias, ending, key_prefix, workers, tmp_path
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = Journal(tmp_path / "journal.jsonl")
    e = ENDINGS[ending]
    runner = workers.start(backend, *POOL, env=journal.env(), wait_ready=False, **FAST)
    frozen = None
    if e.freeze:
        args = (*POOL, "--queues", FROZEN)
        frozen = workers.start(backend, *args, env=journal.env(), wait_ready=False, **FAST)
        frozen.wait_ready()
    runner.wait_ready()
    wait_until(lambda: service.master() is not None, 30, "no master", logs=workers.logs)
    matrix = Matrix(e, service, journal, workers.logs)
    matrix.submit()
    matrix.during()
    matrix.finish(frozen)
    matrix.check()
    assert not matrix.failures, "\n".join(matrix.failures)
    if frozen is not None:
        frozen.popen.send_signal(18)  # SIGCONT, to stop it
    service.storage.close()
