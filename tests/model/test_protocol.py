"""Model-based test: random interleavings of submits, claims, outcomes, operator actions, clock
jumps and the master's chores, run against a real storage and tests/model/reference.py at once.

After every step the storage's answers (status, attempts, waiting_for, batch counters, what a
claim takes, which leases a heartbeat keeps, the holder of each unique key) must equal the
model's, and the invariants of docs/guarantees.md must hold. Profiles (RE_MODEL_PROFILE):
``ci`` (default, bounded and derandomized: about half a minute per storage) and ``long``
(10,000 examples per storage; see docs/reliability.md).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import uuid

from django.apps import apps
from django.db import connections
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from django_reliable_executor import TaskSubmitError, TaskSubmitRequest
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.core.records import Claim
from django_reliable_executor.core.serialization import encode
from django_reliable_executor.core.uniqueness import unique_digest
from django_reliable_executor.core.waits import EVENT, SLEEP, Wait
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.conftest import delete_prefix, new_storage, redis_client
from tests.support import contract_support  # noqa: F401 - registers the contract.hook handler

from .reference import TERMINAL, Model, Refused, Spec, StillRunning

LEASE = 60.0
NAME = "contract.hook"
QUEUES = ("q1", "q2")
CALLBACK_QUEUE = "cb"  # no simulated worker claims it: callbacks stay stored, CREATED
WORKERS = ("w0", "w1", "w2")
RETENTION = 30.0
EVENT_NAMES = ("go", "other")

PROFILES = {
    # Bounded for CI (the four storages together take about two minutes on 2 cores), and the
    # same examples on every run: a failure in CI reproduces locally.
    "ci": settings(
        max_examples=int(os.environ.get("RE_MODEL_EXAMPLES", "150")),
        stateful_step_count=int(os.environ.get("RE_MODEL_STEPS", "40")),
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    ),
    # Before a release (docs/reliability.md): hours, not minutes.
    "long": settings(
        max_examples=int(os.environ.get("RE_MODEL_EXAMPLES", "10000")),
        stateful_step_count=50,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    ),
}
# A failing example is shrunk to a short one; RE_MODEL_SHRINK=0 reports it as found (faster
# while a model is being written).
if os.environ.get("RE_MODEL_SHRINK") == "0":
    PROFILES = {
        name: settings(profile, phases=[Phase.explicit, Phase.reuse, Phase.generate])
        for name, profile in PROFILES.items()
    }
PROFILE = os.environ.get("RE_MODEL_PROFILE", "ci")
# MariaDB and PostgreSQL run the database storage's code that SQLite runs in full (150
# examples), through their own drivers and SQL: fewer examples each in CI, where a server
# round trip makes an example several times slower (the long profile runs them all).
SERVER_DATABASES = ("mariadb", "postgres")
SERVER_DATABASE_EXAMPLES = 80
# What a run did, printed at its end (pytest -s shows it): the long profile's counts in
# docs/reliability.md come from here.
RUNS = {"examples": 0, "checks": 0}


def task_tables() -> list[str]:
    """The executor's tables, dependents first (a cheap DELETE of each between examples)."""
    models = apps.get_app_config("django_reliable_executor").get_models()
    return [model._meta.db_table for model in reversed(list(models))]


@dataclasses.dataclass
class Held:
    """A claim a simulated worker took, kept after it is lost: writes with a stale token."""

    worker: str
    number: int  # the model's claim number
    claim: Claim


class ProtocolMachine(RuleBasedStateMachine):
    """One example: a fresh storage (emptied tables, or a new Redis key prefix), a fake clock."""

    alias: str = "default"

    def __init__(self) -> None:
        super().__init__()
        RUNS["examples"] += 1
        self.clock = FakeClock()
        self.prefix = f"model-{uuid.uuid4().hex[:12]}"
        if self.alias != "redis":
            with connections[self.alias].cursor() as cursor:
                for table in task_tables():
                    cursor.execute(f"DELETE FROM {table}")
        self.storage = new_storage(self.alias, self.prefix, clock=self.clock)
        self.executor = ReliableExecutor(self.storage, clock=self.clock)
        self.model = Model(LEASE, "sqlite" if self.alias == "default" else self.alias)
        self.claims: list[Held] = []
        self.counter = 0
        self.retried: set[str] = set()  # tasks retried by hand (for the known divergences)
        self.seen_terminal: dict[str, str] = {}
        self.ended_ever: set[str] = set()  # tasks that ended (§6.1) at some step
        self.callbacks_seen: dict[str, dict[str, str]] = {}  # batch -> kind -> task id

    def teardown(self) -> None:
        if self.alias == "redis":
            client = redis_client()
            delete_prefix(client, self.prefix)
            client.close()
            self.storage.close()

    @property
    def now(self) -> dt.datetime:
        return self.clock.now()

    # -- submitting -------------------------------------------------------------------------
    def new_id(self) -> str:
        self.counter += 1
        return f"t{self.counter}"

    def spec(self, data: st.DataObject, *, allow_unique: bool = True, deps: bool = True) -> Spec:
        """A request: mostly a new task, sometimes an existing id or a dependency on an id
        that does not exist (odd members)."""
        known = sorted(self.model.tasks)
        odd = data.draw(st.sampled_from(["new"] * 6 + ["existing", "ghost-dep"]))
        task_id = self.new_id()
        if odd == "existing" and known:
            task_id = data.draw(st.sampled_from(known))
        depends_on: tuple[str, ...] = ()
        if deps and known and data.draw(st.booleans()):
            depends_on = tuple(data.draw(st.lists(st.sampled_from(known), max_size=2, unique=True)))
        if odd == "ghost-dep" and deps:
            depends_on += ("ghost",)
        unique_key = None
        # With an existing id too: that task answers, unchanged, and takes no key.
        if allow_unique and data.draw(st.integers(0, 3)) == 0:
            unique_key = data.draw(st.sampled_from(["k1", "k2"]))
        return Spec(
            task_id=task_id,
            queue=data.draw(st.sampled_from(QUEUES)),
            delay_s=0 if depends_on else data.draw(st.sampled_from([0, 0, 5])),
            retry_limit=data.draw(st.integers(0, 2)),
            max_duration_ms=data.draw(st.sampled_from([None, 20000])),
            depends_on=depends_on,
            on_dependency_failure=data.draw(st.sampled_from(["cancel", "run"])),
            unique_key=unique_key,
        )

    @staticmethod
    def request(spec: Spec) -> TaskSubmitRequest:
        return TaskSubmitRequest(
            NAME,
            {"id": spec.task_id},
            task_id=spec.task_id,
            queue=spec.queue,
            # A priority of its own for every task (older first): which tasks a claim of N
            # takes is then the same on every run of an example. Among equal tasks a storage
            # may pick others from one run to the next (PostgreSQL's row order), and
            # Hypothesis refuses an example whose draws then differ when it replays it.
            priority=-int(spec.task_id[1:]) if spec.task_id[1:].isdigit() else 0,
            retry_limit=spec.retry_limit,
            retry_interval=1000,
            retry_backoff="fixed",
            max_duration_millis=spec.max_duration_ms,
            delay_millis=int(spec.delay_s * 1000),
            depends_on=list(spec.depends_on) or None,
            on_dependency_failure=spec.on_dependency_failure,
            unique_for=spec.unique_for_s if spec.unique_key else None,
            unique_key=spec.unique_key,
        )

    def submit_both(self, specs: list[Spec], real) -> None:
        """The same call on the model and the storage: both refuse, or both answer the same ids."""
        try:
            expected = self.model.submit(specs, self.now)
        except Refused:
            expected = None
        try:
            answered = [info.task_id for info in real()]
        except TaskSubmitError:
            answered = None
        assert answered == expected, (specs, answered, expected)

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        spec = self.spec(data)
        self.submit_both([spec], lambda: [self.executor.submit_task(self.request(spec))])

    @rule(data=st.data(), n=st.integers(2, 3))
    def submit_many(self, data: st.DataObject, n: int) -> None:
        specs = [self.spec(data) for _ in range(n)]
        self.submit_both(specs, lambda: self.executor.submit_many([self.request(s) for s in specs]))

    @rule(data=st.data(), n=st.integers(2, 3))
    def chain(self, data: st.DataObject, n: int) -> None:
        specs = [self.spec(data) for _ in range(n)]
        for before, step in zip(specs, specs[1:], strict=False):
            step.depends_on = (*step.depends_on, before.task_id)
            step.delay_s = 0
        self.submit_both(specs, lambda: self.executor.chain([self.request(s) for s in specs]))

    @rule(data=st.data(), n=st.integers(1, 3), on_complete=st.booleans(), on_success=st.booleans())
    def submit_batch(
        self, data: st.DataObject, n: int, on_complete: bool, on_success: bool
    ) -> None:
        specs = [self.spec(data, allow_unique=False) for _ in range(n)]
        if len({s.task_id for s in specs}) < n:
            return  # a repeated id: refused by the service's own check, before any rule
        batch_id = f"b{self.new_id()}"

        def callback(kind: str) -> TaskSubmitRequest:
            return TaskSubmitRequest(NAME, {"cb": kind}, queue=CALLBACK_QUEUE)

        try:
            self.model.submit_batch(batch_id, specs, self.now, on_complete, on_success)
            expected = True
        except Refused:
            expected = False
        try:
            self.executor.submit_batch(
                [self.request(s) for s in specs],
                batch_id=batch_id,
                on_complete=callback("complete") if on_complete else None,
                on_success=callback("success") if on_success else None,
            )
            stored = True
        except TaskSubmitError:
            stored = False
        assert stored == expected, (specs, stored)

    # -- simulated workers ------------------------------------------------------------------
    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim_and_start(self, worker: str, limit: int) -> None:
        """What a worker with idle threads does: claim, then start each claim at once."""
        first = len(self.claims)
        self.claim(worker, limit)
        for held in self.claims[first:]:
            self.start_claim(held)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4))
    def claim(self, worker: str, limit: int) -> None:
        claimable = {
            t.task_id for t in self.model.tasks.values() if self.model.claimable(t, self.now)
        }
        claims = self.storage.claim(worker, list(QUEUES), limit, LEASE)
        taken = [c.task_id for c in claims]
        assert len(taken) == len(set(taken))
        assert set(taken) <= claimable, f"claimed what is not claimable: {set(taken) - claimable}"
        assert len(taken) == min(limit, len(claimable)), (taken, claimable)
        for claim in claims:
            task = self.model.tasks[claim.task_id]
            # A dependent never runs before its dependencies ended.
            if not (
                claim.task_id in self.retried
                and "retried-dependent-runs-at-once" in self.model.known
            ):
                for dep_id in task.depends_on:
                    # (A dependency retried by hand after the dependent was let go does not
                    # hold it back again.)
                    assert dep_id in self.ended_ever, (claim.task_id, dep_id)
            number = self.model.claim(claim.task_id, worker, self.now)
            self.claims.append(Held(worker, number, claim))

    def pick(self, data: st.DataObject, started: bool = False) -> Held | None:
        """A claim: usually one still held, sometimes a stale one (``started``: of those a
        start was recorded for, as a worker reports outcomes only of attempts it ran)."""
        # In a fixed order (not the storage's: which of two equal tasks a claim returns first
        # may differ between two runs of one example, and Hypothesis replays examples).
        mine = sorted(
            (h for h in self.claims if h.claim.is_started or not started),
            key=lambda h: (h.claim.task_id, h.number),
        )
        live = [h for h in mine if self.model.holds(h.claim.task_id, h.number)]
        pool = live if live and data.draw(st.integers(0, 2)) else mine
        return data.draw(st.sampled_from(pool)) if pool else None

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        held = self.pick(data)
        assert held is not None
        self.start_claim(held)

    def start_claim(self, held: Held) -> None:
        claim = held.claim
        if claim.deadline_at is not None and self.now >= claim.deadline_at:
            # What the worker does with a claim past its deadline: time it out unstarted.
            expected = self.model.expire_claim(claim.task_id, held.number, self.now)
            assert (self.storage.expire_claim(claim) is not None) == expected
            return
        expected = self.model.start(claim.task_id, held.number, self.now)
        started = self.storage.start(claim, LEASE)
        assert (started is not None) == expected, (claim.task_id, held.number)
        if started is not None:
            held.claim = started

    @precondition(lambda self: self.claims)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """A worker hands an unstarted claim back (a stop, a failed start)."""
        held = self.pick(data)
        assert held is not None
        if held.claim.is_started:
            return
        expected = self.model.release(held.claim.task_id, held.number)
        assert self.storage.release([held.claim]) == int(expected), held.claim.task_id

    @precondition(lambda self: self.claims)
    @rule(data=st.data(), outcome=st.sampled_from(["complete", "retryable", "final"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        held = self.pick(data, started=True)
        if held is None:
            return
        self.finish_claim(held, outcome)

    def finish_claim(self, held: Held, outcome: str) -> None:
        task_id = held.claim.task_id
        if outcome == "complete":
            expected = self.model.complete(task_id, held.number, self.now)
            written = self.storage.complete(held.claim, {"ok": task_id})
            assert (written is not None) == expected, (task_id, written)
            return
        status = self.model.fail(task_id, held.number, self.now, outcome == "retryable")
        written = self.storage.fail(held.claim, "boom", retryable=outcome == "retryable")
        assert (written.status.value if written is not None else None) == status, task_id

    @precondition(lambda self: self.claims)
    @rule(
        data=st.data(),
        kind=st.sampled_from(["sleep", "event", "event-timeout", "stop"]),
        seconds=st.sampled_from([5, 30]),
    )
    def suspend(self, data: st.DataObject, kind: str, seconds: float) -> None:
        """A handler stops at a durable wait (or at a step, the worker stopping)."""
        held = self.pick(data, started=True)
        if held is None:
            return
        until = self.now + dt.timedelta(seconds=seconds)
        wait = {
            "sleep": Wait(SLEEP, "nap", until=until),
            # (context.wait_for_event names the wait after its event)
            "event": Wait(EVENT, EVENT_NAMES[0], event=EVENT_NAMES[0]),
            "event-timeout": Wait(EVENT, EVENT_NAMES[0], until=until, event=EVENT_NAMES[0]),
            "stop": None,
        }[kind]
        expected = self.model.suspend(
            held.claim.task_id,
            held.number,
            self.now,
            None if wait is None else wait.kind,
            until=None if wait is None else wait.until,
            event=None if wait is None else wait.event,
        )
        written = self.storage.suspend(held.claim, wait)
        assert (written is not None) == expected, (held.claim.task_id, kind, written)

    @rule(data=st.data(), name=st.sampled_from(EVENT_NAMES))
    def send_event(self, data: st.DataObject, name: str) -> None:
        task_id = self.some_task(data)
        expected = self.model.send_event(task_id, name, self.now)
        assert self.storage.send_event(task_id, name, encode({"sent": name})) == expected

    @rule(worker=st.sampled_from(WORKERS), twin=st.booleans())
    def heartbeat(self, worker: str, twin: bool) -> None:
        """The worker renews the newest claim of each task it took; its ``twin`` (a second
        process with the same worker id, or one restarted) the oldest: stale tokens."""
        latest: dict[str, Held] = {}
        for held in self.claims:
            if held.worker == worker and not (twin and held.claim.task_id in latest):
                latest[held.claim.task_id] = held
        tokens = {task_id: h.claim.token for task_id, h in latest.items()}
        numbers = {task_id: h.number for task_id, h in latest.items()}
        expected = self.model.heartbeat(worker, numbers, self.now)
        answered = self.storage.heartbeat(worker, tokens, LEASE)
        assert set(answered) == expected, (worker, set(answered), expected)

    # -- operators, time and the master -----------------------------------------------------
    def some_task(self, data: st.DataObject) -> str:
        """A task for an operator: often one a worker holds, where races are."""
        known = sorted(self.model.tasks) or ["nobody"]
        held = sorted(t for t, task in self.model.tasks.items() if task.lease is not None)
        if held and data.draw(st.booleans()):
            return data.draw(st.sampled_from(held))
        return data.draw(st.sampled_from(known))

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = self.some_task(data)
        expected = self.model.cancel(task_id, self.now)
        assert self.executor.cancel_task(task_id) == expected, task_id

    @rule(data=st.data(), which=st.sampled_from(["held", "terminal", "any"]))
    def retry(self, data: st.DataObject, which: str) -> None:
        """A retry by hand: of a terminal task whose handler may still run (its lease held),
        of any terminal task, or of any task at all."""
        terminal = sorted(t for t, task in self.model.tasks.items() if task.status in TERMINAL)
        held = [t for t in terminal if self.model.tasks[t].lease is not None]
        pool = {"held": held, "terminal": terminal}.get(which)
        task_id = data.draw(st.sampled_from(pool)) if pool else self.some_task(data)
        before = self.model.tasks.get(task_id)
        was_running = before is not None and self.model.handler_may_run(before, self.now)
        # A terminal task whose kept lease lapsed: the retry ends that attempt first (§6.1).
        lapsed = (
            before is not None
            and before.status in TERMINAL
            and before.lease is not None
            and before.lease.started
            and not was_running
        )
        try:
            expected = self.model.retry(task_id, self.now)
        except StillRunning:
            expected = False
        reason = self.executor.retry_task_or_reason(task_id)
        if was_running and before is not None and before.status in TERMINAL:
            assert reason is not None and "still running" in reason, (task_id, reason)
        assert (reason is None) == expected, (task_id, reason)
        if lapsed:
            self.ended_ever.add(task_id)
        if expected:
            self.retried.add(task_id)
            self.seen_terminal.pop(task_id, None)

    @rule(queue=st.sampled_from(QUEUES), pause=st.booleans())
    def pause_or_resume(self, queue: str, pause: bool) -> None:
        if pause:
            assert self.storage.pause_queue(queue) == self.model.pause(queue)
        else:
            assert self.storage.resume_queue(queue) == self.model.resume(queue)

    @rule(seconds=st.sampled_from([1, 6, 21, LEASE + 1]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(to=st.sampled_from(["running-deadline", "deadline", "lease"]))
    def advance_past(self, to: str) -> None:
        """Just past the next deadline (of a running task, or of any live one) or lease
        expiry: where timeouts, recoveries and handlers still running race."""
        now = self.now
        tasks = self.model.tasks.values()
        if to == "lease":
            times = [t.lease.until for t in tasks if t.lease is not None]
        else:
            wanted = ("RUNNING",) if to == "running-deadline" else ("CREATED", "PENDING", "RUNNING")
            times = [t.deadline for t in tasks if t.status in wanted]
        later = [when for when in times if when is not None and when > now]
        if later:
            self.clock.advance((min(later) - now).total_seconds() + 0.5)

    @rule(data=st.data())
    def time_out_running(self, data: st.DataObject) -> None:
        """A running attempt outlives its task's deadline: the clock passes it, the master
        times the task out while the handler still runs (it keeps its lease)."""
        running = sorted(
            t.task_id
            for t in self.model.tasks.values()
            if t.status == "RUNNING" and t.deadline is not None
        )
        if not running:
            return
        deadline = self.model.tasks[data.draw(st.sampled_from(running))].deadline
        assert deadline is not None
        if deadline > self.now:
            self.clock.advance((deadline - self.now).total_seconds() + 0.5)
        self.chores("expire")

    # -- scenarios in one step: the deep interleavings random steps seldom build ------------
    def live_claims(self, *, started: bool) -> list[Held]:
        return sorted(
            (
                h
                for h in self.claims
                if h.claim.is_started == started and self.model.holds(h.claim.task_id, h.number)
            ),
            key=lambda h: (h.claim.task_id, h.number),
        )

    @rule(data=st.data())
    def start_after_a_reclaim_by_the_same_worker(self, data: st.DataObject) -> None:
        """A worker hands a claim back, claims the task again (a new token), then starts the
        old claim: refused, though the worker and the task's claimed state match."""
        pool = self.live_claims(started=False)
        if not pool:
            return
        old = data.draw(st.sampled_from(pool))
        expected = self.model.release(old.claim.task_id, old.number)
        assert self.storage.release([old.claim]) == int(expected), old.claim.task_id
        claimable = [t for t in self.model.tasks.values() if self.model.claimable(t, self.now)]
        self.claim(old.worker, max(1, len(claimable)))
        self.start_claim(old)

    @rule(data=st.data(), outcome=st.sampled_from(["retryable", "final", "complete"]))
    def finish_past_the_deadline(self, data: st.DataObject, outcome: str) -> None:
        """A running attempt outlives its task's deadline and reports before the master's
        expire round: a failure then ends the task TIMEOUT (never a retry)."""
        pool = [
            h
            for h in self.live_claims(started=True)
            if self.model.tasks[h.claim.task_id].deadline is not None
        ]
        if not pool:
            return
        held = data.draw(st.sampled_from(pool))
        deadline = self.model.tasks[held.claim.task_id].deadline
        assert deadline is not None
        if deadline > self.now:
            self.clock.advance((deadline - self.now).total_seconds() + 0.5)
        self.finish_claim(held, outcome)

    @rule(data=st.data())
    def depend_on_a_timed_out_running_task(self, data: st.DataObject) -> None:
        """A task timed out while its handler still runs (its lease kept) has not ended: a
        dependent submitted then waits for it (DESIGN §6.1)."""
        self.time_out_running(data)
        running_out = sorted(
            t.task_id
            for t in self.model.tasks.values()
            if t.status == "TIMEOUT" and self.model.handler_may_run(t, self.now)
        )
        if not running_out:
            return
        spec = self.spec(data, allow_unique=False, deps=False)
        spec.depends_on = (data.draw(st.sampled_from(running_out)),)
        spec.delay_s = 0
        self.submit_both([spec], lambda: [self.executor.submit_task(self.request(spec))])

    @rule(data=st.data())
    def retry_a_timed_out_running_task(self, data: st.DataObject) -> None:
        """A retry by hand of a task timed out while its handler still runs: refused while
        that handler holds its lease, so the task never runs twice at once (DESIGN §6.1)."""
        self.time_out_running(data)
        if any(
            t.status == "TIMEOUT" and self.model.handler_may_run(t, self.now)
            for t in self.model.tasks.values()
        ):
            self.retry(data, "held")

    @rule(chore=st.sampled_from(["round", "round", "recover", "expire", "promote", "purge"]))
    def chores(self, chore: str) -> None:
        if chore == "round":  # one round of the master's, in MasterChores' order
            for each in ("promote", "recover", "expire", "purge"):
                self.chores(each)
        elif chore == "recover":
            self.storage.recover_expired(500)
            self.model.recover_expired(self.now)
        elif chore == "expire":
            self.storage.expire_overdue(500)
            self.model.expire_overdue(self.now)
        elif chore == "promote":
            self.storage.promote_due(500)
        else:
            before = self.now - dt.timedelta(seconds=RETENTION)
            self.storage.purge_finished(before, 500)
            self.model.purge(
                before, self.now, lambda task_id: self.storage.get(task_id) is not None
            )
        self.storage.deliver_messages(500)

    # -- after every step -------------------------------------------------------------------
    @invariant()
    def same_tasks(self) -> None:
        stored = self.storage.get_many(sorted(self.model.tasks))
        assert set(stored) == set(self.model.tasks), "stored tasks differ from the model's"
        for task_id, task in self.model.tasks.items():
            info = stored[task_id]
            waits = info.waiting["kind"] if info.waiting else None
            got = (info.status.value, info.attempts, set(info.waiting_for), waits)
            # TaskInfo.waiting is shown while the task waits (PENDING) only.
            wait = task.waiting if task.status == "PENDING" else None
            model = (task.status, task.attempts, task.waiting_for, wait)
            assert got == model, (task_id, got, task)
            assert info.resumptions == task.resumptions, (task_id, info, task)
            # A terminal state changes only by a manual retry.
            previous = self.seen_terminal.get(task_id)
            assert previous is None or previous == info.status.value, (task_id, previous)
            if info.status.value in TERMINAL:
                self.seen_terminal[task_id] = info.status.value
            if self.model.ended(task, self.now):
                self.ended_ever.add(task_id)
        for task_id in self.model.purged:
            assert self.storage.get(task_id) is None or task_id in self.model.tasks, task_id
        # Purge takes only ended tasks: one that ended and was purged in the same step (a
        # master round recovers, then purges) had ended all the same.
        self.ended_ever.update(self.model.purged)

    @invariant()
    def batches_and_callbacks(self) -> None:
        for batch_id, batch in self.model.batches.items():
            info = self.storage.get_batch(batch_id)
            assert info is not None, batch_id
            counts = {
                k: getattr(info, k)
                for k in ("total", "completed", "failed", "cancelled", "pending")
            }
            assert counts == self.model.batch_counts(batch), (
                batch_id,
                counts,
                batch,
                [self.model.tasks.get(m) for m in batch.members],
                self.storage.get_many(batch.members),
            )
            assert info.finished == batch.finished, batch_id
            members = set(batch.members)
            found: dict[str, list[str]] = {}
            for task in self.storage.list(batch_id=batch_id, limit=100):
                if task.task_id not in members:
                    found.setdefault(task.parameter["cb"], []).append(task.task_id)
            # Stored exactly once, and only once every member ended.
            assert {kind: len(ids) for kind, ids in found.items()} == dict.fromkeys(
                batch.callbacks, 1
            ), (batch_id, found, batch)
            seen = self.callbacks_seen.setdefault(batch_id, {})
            for kind, ids in found.items():
                assert seen.setdefault(kind, ids[0]) == ids[0], "a callback stored twice"

    @invariant()
    def counted(self) -> None:
        RUNS["checks"] += 1  # after the start and after every step: the report's count

    @invariant()
    def unique_keys(self) -> None:
        for key in ("k1", "k2"):
            holder = self.model.unique_holder(key, self.now)
            info = self.storage.unique_holder(unique_digest(NAME, key, None))
            got = info.task_id if info is not None else None
            assert got == (holder.task_id if holder is not None else None), (
                key,
                info,
                self.model.tasks.get(got or ""),
                holder,
                holder and self.storage.get(holder.task_id),
                self.now,
            )


def test_protocol_against_the_model(alias: str) -> None:
    """The storage under test agrees with the reference model over random interleavings."""
    machine = type(f"Protocol_{alias}", (ProtocolMachine,), {"alias": alias})
    RUNS.update(examples=0, checks=0)
    profile = PROFILES[PROFILE]
    if PROFILE == "ci" and alias in SERVER_DATABASES and "RE_MODEL_EXAMPLES" not in os.environ:
        profile = settings(profile, max_examples=SERVER_DATABASE_EXAMPLES)
    run_state_machine_as_test(machine, settings=profile)
    print(
        f"\nmodel test, {alias}, profile {PROFILE}: {RUNS['examples']} examples, "
        f"{RUNS['checks']} checks of the storage against the model (one after each step)"
    )
