"""What the handlers themselves say ran when (the demo.journal handler's records), what the
test did to which process, and the checks every fault scenario ends with."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from django_reliable_executor import TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.processes import WorkerProcess, read_journal, wait_until


@dataclasses.dataclass(frozen=True)
class Run:
    """One execution of a handler, from its own start and end records (end is None when the
    process died or froze before it returned)."""

    task: str
    attempt: int
    pid: int
    start: float
    end: float | None


class Journal:
    """The file demo.journal appends to (RE_JOURNAL): one JSON line per start and per end."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def env(self) -> dict[str, str]:
        """The variables that make a runexecutor subprocess write here."""
        return {"RE_JOURNAL": str(self.path)}

    def records(self) -> list[dict]:
        return read_journal(self.path)

    def runs(self) -> dict[str, list[Run]]:
        """Every run of every task, in the order the storage started their attempts (attempt
        numbers), then by when the handler began. Not by handler start alone: a process frozen
        right after its attempt's start write calls the handler only once resumed, after the
        attempt that replaced it began; its run is still the earlier attempt."""
        starts: dict[tuple[str, int, int], float] = {}
        ends: dict[tuple[str, int, int], float] = {}
        for record in self.records():
            key = (record["task"], record["attempt"], record["pid"])
            (starts if record["event"] == "start" else ends)[key] = record["t"]
        runs: dict[str, list[Run]] = defaultdict(list)
        for (task, attempt, pid), start in starts.items():
            runs[task].append(Run(task, attempt, pid, start, ends.get((task, attempt, pid))))
        for task_runs in runs.values():
            task_runs.sort(key=lambda run: (run.attempt, run.start))
        return dict(runs)

    def events(self, task: str, event: str) -> list[dict]:
        """The records of one kind ("start", "end", "cancelled", "finally") of one task."""
        return [r for r in self.records() if r["task"] == task and r["event"] == event]

    def started(self) -> int:
        return sum(1 for record in self.records() if record["event"] == "start")

    def pids_running_after(self, moment: float) -> set[int]:
        """Processes that started a handler after ``moment``."""
        return {r["pid"] for r in self.records() if r["event"] == "start" and r["t"] > moment}


def unfinished_runs(journal: Journal, pid: int) -> dict[str, int]:
    """Task id -> attempt of the handlers this process started and has not returned from."""
    return {
        run.task: run.attempt
        for runs in journal.runs().values()
        for run in runs
        if run.pid == pid and run.end is None
    }


def freeze_mid_run(
    faults: Faults, journal: Journal, process: WorkerProcess, logs: Callable[[], str]
) -> dict[str, int]:
    """Freeze ``process`` while it has handlers half done; returns them (task -> attempt)."""
    for _ in range(20):
        wait_until(lambda: unfinished_runs(journal, process.pid), 60, "it ran nothing", logs=logs)
        faults.freeze(process)
        stranded = unfinished_runs(journal, process.pid)  # its journal is still now
        if stranded:
            return stranded
        faults.thaw(process)  # caught between two tasks: let it go on and try again
    raise AssertionError("never caught the process with a handler running")


@dataclasses.dataclass
class Faults:
    """What the test did to its workers, by pid, on the wall clock the journal uses."""

    killed: dict[int, float] = dataclasses.field(default_factory=dict)  # the last kill per pid
    # Every kill per pid: a long run starts so many processes that the kernel hands a pid out
    # again (pid_max is 32 768 here), and a later process's kill must not date an earlier one's.
    kills: dict[int, list[float]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    frozen: dict[int, list[tuple[float, float | None]]] = dataclasses.field(
        default_factory=lambda: defaultdict(list)
    )

    def kill(self, process: WorkerProcess) -> None:
        """SIGKILL the process (and reap it). The time is taken once it is gone: until then
        it may still write."""
        pid = process.pid
        process.kill()
        self.note_killed(pid, time.time())

    def note_killed(self, pid: int, at: float) -> None:
        """Record that the process ``pid`` ended at ``at`` (killed, or found gone)."""
        self.killed[pid] = at
        self.kills[pid].append(at)

    def killed_after(self, pid: int, moment: float) -> float | None:
        """When the process that had ``pid`` at ``moment`` was killed: the first kill of that
        pid at or after ``moment`` (an earlier kill ended an earlier process), or None."""
        return min((at for at in self.kills.get(pid, []) if at >= moment), default=None)

    def freeze(self, process: WorkerProcess) -> None:
        """SIGSTOP: the process keeps its connections but runs nothing."""
        self.frozen[process.pid].append((time.time(), None))
        os.kill(process.pid, signal.SIGSTOP)

    def thaw(self, process: WorkerProcess) -> None:
        os.kill(process.pid, signal.SIGCONT)
        stopped, _ = self.frozen[process.pid][-1]
        self.frozen[process.pid][-1] = (stopped, time.time())

    def disturbed_before(self, pid: int, since: float, moment: float) -> bool:
        """Was the process that had ``pid`` at ``since`` killed after ``since`` and before
        ``moment``, or frozen before ``moment``? (A kill before ``since`` ended an earlier
        process with that pid.)"""
        killed = self.killed_after(pid, since)
        if killed is not None and killed <= moment:
            return True
        return any(stopped <= moment for stopped, _ in self.frozen.get(pid, []))

    def frozen_at(self, pid: int, moment: float) -> bool:
        return any(
            stopped <= moment and (resumed is None or moment <= resumed)
            for stopped, resumed in self.frozen.get(pid, [])
        )


def check_runs(
    journal: Journal,
    faults: Faults,
    service: ReliableExecutor,
    task_ids: Iterable[str],
    *,
    expected: TaskStatus = TaskStatus.COMPLETED,
    repeat_allowed: Callable[[Run, Run], bool] | None = None,
    overlap_allowed: Callable[[Run, Run], bool] | None = None,
) -> list[str]:
    """Every promise of docs/guarantees.md a fault scenario can break, checked against the
    handlers' own records. Returns the problems found (empty when sound):

    - every task is terminal, with the ``expected`` status;
    - none was lost: a COMPLETED task has a run that returned;
    - no two runs of a task overlapped, unless the earlier one's process was frozen then (or
      ``overlap_allowed`` says why else they may: a lease that really lapsed);
    - a task ran again only after the process of its earlier run was killed or frozen
      (or ``repeat_allowed`` says why else it may).
    """
    problems: list[str] = []
    runs = journal.runs()
    for task_id in task_ids:
        task = service.get_task(task_id)
        if task is None:
            problems.append(f"{task_id}: lost from the storage")
            continue
        if task.status is not expected:
            problems.append(f"{task_id}: {task.status.value}, expected {expected.value}")
        task_runs = runs.get(task_id, [])
        if expected is TaskStatus.COMPLETED and not any(r.end is not None for r in task_runs):
            problems.append(f"{task_id}: COMPLETED without any run that returned ({task_runs})")
        for earlier, later in zip(task_runs, task_runs[1:], strict=False):
            ended = (
                earlier.end
                if earlier.end is not None
                else faults.killed_after(earlier.pid, earlier.start)
            )
            if (
                (ended is None or ended > later.start)
                and not faults.frozen_at(earlier.pid, later.start)
                and not (overlap_allowed is not None and overlap_allowed(earlier, later))
            ):
                problems.append(f"{task_id}: runs overlapped: {earlier} and {later}")
            if not faults.disturbed_before(earlier.pid, earlier.start, later.start) and not (
                repeat_allowed is not None and repeat_allowed(earlier, later)
            ):
                problems.append(f"{task_id}: ran again while its worker lived: {earlier}, {later}")
    return problems
