"""TaskInterventions: what an operator does to one stored task (cancel it, retry it, from a
step too, send it an event), part of ReliableExecutor's public service."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..core.records import Transition
from ..core.states import RETRYABLE_BY_HAND, TaskStatus
from ..core.steps import check_step_name
from ..exceptions import AttemptStillRunningError, DependencyNotCompletedError
from .listing import storable_id
from .submitting import event_payload

if TYPE_CHECKING:
    from ..conf import ExecutorSettings
    from ..observability.announcer import Announcer
    from ..storage import TaskStorage


class TaskInterventions:
    """ReliableExecutor's operations on one task by its id (a mixin: it uses the executor's
    storage, settings and announcer)."""

    announcer: Announcer

    if TYPE_CHECKING:

        @property
        def storage(self) -> TaskStorage: ...

        @property
        def settings(self) -> ExecutorSettings: ...

    def cancel_task(self, task_id: str) -> bool:
        """CREATED/PENDING -> CANCELLED (True); RUNNING -> cancel requested (True); else False."""
        if not storable_id(task_id):
            return False
        result = self.storage.cancel(task_id)
        if result.changed and result.task is not None:
            if result.requested_only:
                self.announcer.cancel_requested(result.task)
            else:
                self.announcer.transition(Transition(task=result.task, previous=TaskStatus.PENDING))
        return result.changed

    def retry_task(self, task_id: str, from_step: str | None = None) -> bool:
        """FAILED/TIMEOUT/ERROR/CANCELLED -> PENDING due now, with a fresh retry budget (a
        dependent whose dependencies have not all ended waits for them again instead). False
        when the status forbids it, while the handler of a timed-out attempt still runs, or
        for a dependent whose dependency ended otherwise than COMPLETED unless it runs on
        failure (``retry_task_or_reason`` says which).

        ``from_step``: the name of a durable step (``context.step``) whose checkpoint is
        stored: that checkpoint and those of every step that finished after it are deleted
        in the same atomic step as the retry, so the task runs those steps again (the
        earlier ones return their stored results). UnknownStepError (a ValueError) when the
        task has no checkpoint of that step: nothing is changed."""
        return self.retry_task_or_reason(task_id, from_step) is None

    def retry_task_or_reason(self, task_id: str, from_step: str | None = None) -> str | None:
        """Retry like ``retry_task``; None when retried, else why not, in words for the admin,
        the API and the command: "not found", "COMPLETED cannot be retried", "its previous
        attempt is still running on worker ... (lease until ...)", "its dependency ... ended
        FAILED, and it runs only after its dependencies completed ..." or "changed
        meanwhile". A dependent retried while a dependency has not ended waits for it again
        (CREATED, ``waiting_for``), as it did after its submit. ``from_step`` as in
        ``retry_task``: its UnknownStepError is raised, not returned."""
        if from_step is not None:
            check_step_name(from_step, "from_step")
        if not storable_id(task_id):
            return "not found"
        try:
            transition = self.storage.retry(task_id, from_step)
        except (AttemptStillRunningError, DependencyNotCompletedError) as exc:
            return str(exc)
        if transition is not None:
            self.announcer.retried(transition)
            return None
        task = self.storage.get(task_id)
        if task is None:
            return "not found"
        if task.status not in RETRYABLE_BY_HAND:
            return f"{task.status.value} cannot be retried"
        return "changed meanwhile"

    def send_event(self, task_id: str, name: str, payload: Any = None) -> bool:
        """Send event ``name`` to task ``task_id``: ``context.wait_for_event(name)`` returns
        ``payload`` (a JSON value, checked as a task's parameter is), at once if the handler
        calls it later, and a task waiting for it is due now. The first payload sent under a
        name is kept: a second send changes nothing and returns True. True when the task
        exists and is not terminal; False otherwise (nothing stored). TypeError or ValueError
        naming what was wrong (the name, the payload); nothing is stored then either."""
        check_step_name(name, "event name")
        encoded = event_payload(payload, self.settings.MAX_PARAMETER_BYTES)
        if not storable_id(task_id):
            return False
        return self.storage.send_event(task_id, name, encoded)

    def count_waiting(self) -> dict[str, int]:
        """How many tasks are in a durable wait (``TaskInfo.waiting`` set), by kind:
        ``{"sleep": n, "event": n, "tasks": n}``."""
        return self.storage.count_waiting()
