"""The storage interface's durable steps and waits (``context.step``, ``sleep``,
``wait_for_event``, ``wait_for``): a task's checkpoints, each written under the attempt's
fencing token, read back by later attempts; a waiting task handed back; events sent to tasks.
TaskStorage inherits it (storage/base.py says which module of each backend holds each
method); the manual retry that discards checkpoints (``retry(task_id, from_step)``) is
base.py's ``retry``, and ``get`` fills ``TaskInfo.steps``."""

from __future__ import annotations

import abc
from typing import Any

from ..core.records import Claim, Transition
from ..core.serialization import Encoded
from ..core.waits import Wait


class StepStorage(abc.ABC):
    """The durable steps of a storage's tasks (one checkpoint per (task, step name)), their
    waits and the events sent to them."""

    @abc.abstractmethod
    def record_step(
        self,
        claim: Claim,
        name: str,
        result: Encoded,
        lease_seconds: float,
        renew_lease: bool = True,
    ) -> bool:
        """Store the checkpoint of step ``name`` of the claim's task (``result``, its JSON
        value and text, finished now) and renew the claim's lease to ``lease_seconds`` from
        now, in one atomic write fenced like every write of a claim: only where the task is
        RUNNING, held by the claim's worker under its token (and, on Redis, still leased).
        A checkpoint of the same name already stored is replaced (finishing now: last in
        the order). Returns False, storing nothing, when the claim is no longer held.

        ``renew_lease=False``: the lease is fresh (the attempt renewed it less than a quarter
        of it ago), so a storage whose renewal is a statement of its own (MariaDB, SQLite)
        skips it; PostgreSQL and Redis renew in the checkpoint's own statement anyway.

        On the database storage the write joins the caller's open transaction (``atomic``
        on ``transaction_alias``): it commits or rolls back with it, and holds the task's
        row locked until then."""

    @abc.abstractmethod
    def step_results(self, task_id: str) -> dict[str, Any]:
        """The stored checkpoints of the task: step name -> its result (a JSON value), in
        the order they finished (empty for an unknown task). Not fenced: a read."""

    @abc.abstractmethod
    def suspend(self, claim: Claim, wait: Wait | None) -> Transition | None:
        """Hand the claim's RUNNING task back as PENDING, without a lease, for a durable wait
        (``wait``) or a stop (None: due again now): fenced like every write of a claim, and
        only while no cancel was requested. The attempt is handed back (``attempts`` and the
        retry budget lose the one the claim counted) and a resumption is counted; a
        ``wait``'s record is stored among the checkpoints under its name unless one is.

        Due: a sleep at its ``until``; an event already sent to the task, or tasks that have
        all ended (§6.1), at once; otherwise at the wait's timeout (``until``), if any, or only
        once ``send_event`` or the last awaited task's ending wakes it. Returns the
        transition, or None when the claim no longer holds the task or a cancel was
        requested (nothing written: the caller records a failure, which ends it CANCELLED)."""

    @abc.abstractmethod
    def send_event(self, task_id: str, name: str, payload: Encoded) -> bool:
        """Store event ``name`` for the task (its JSON ``payload``) unless one of that name is
        stored (the first payload is kept), and make the task due now if it waits for it.
        False, storing nothing, when the task does not exist or is terminal."""

    @abc.abstractmethod
    def task_events(self, task_id: str) -> dict[str, Any]:
        """The events sent to the task: name -> payload, in the order sent. A read."""

    @abc.abstractmethod
    def count_waiting(self) -> dict[str, int]:
        """How many tasks are in a durable wait, by kind ("sleep", "event", "tasks"; every
        kind present). A read (the waiting-tasks gauge)."""
