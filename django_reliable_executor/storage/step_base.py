"""The storage interface's durable steps (``context.step``): a task's checkpoints, each written
under the attempt's fencing token, read back by later attempts. TaskStorage inherits it
(storage/base.py says which module of each backend holds each method); the manual retry that
discards checkpoints (``retry(task_id, from_step)``) is base.py's ``retry``, and ``get`` fills
``TaskInfo.steps``."""

from __future__ import annotations

import abc
from typing import Any

from ..core.records import Claim
from ..core.serialization import Encoded


class StepStorage(abc.ABC):
    """The durable steps of a storage's tasks: one checkpoint per (task, step name)."""

    @abc.abstractmethod
    def record_step(self, claim: Claim, name: str, result: Encoded, lease_seconds: float) -> bool:
        """Store the checkpoint of step ``name`` of the claim's task (``result``, its JSON
        value and text, finished now) and renew the claim's lease to ``lease_seconds`` from
        now, in one atomic write fenced like every write of a claim: only where the task is
        RUNNING, held by the claim's worker under its token (and, on Redis, still leased).
        A checkpoint of the same name already stored is replaced (finishing now: last in
        the order). Returns False, storing nothing, when the claim is no longer held.

        On the database storage the write joins the caller's open transaction (``atomic``
        on ``transaction_alias``): it commits or rolls back with it, and holds the task's
        row locked until then."""

    @abc.abstractmethod
    def step_results(self, task_id: str) -> dict[str, Any]:
        """The stored checkpoints of the task: step name -> its result (a JSON value), in
        the order they finished (empty for an unknown task). Not fenced: a read."""
