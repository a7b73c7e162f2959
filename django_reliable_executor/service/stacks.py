"""LiveStacks: the live Python stack of a running task's handler, asked of its worker through
the storage, part of ReliableExecutor's public service (see core/stacks.py)."""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

from ..core.stacks import ANSWER_SECONDS, ENDED_FIRST, KEEP_SECONDS, StackAnswer, StackRequest
from ..core.states import TaskStatus
from ..exceptions import StackNotAnsweredError, TaskNotRunningError
from .listing import storable_id

if TYPE_CHECKING:
    from ..core.clock import Clock
    from ..storage import TaskStorage

_REQUEST_ID = re.compile(r"[0-9a-f]{32}")


class LiveStacks:
    """ReliableExecutor's live stacks (a mixin: it uses the executor's storage and clock)."""

    if TYPE_CHECKING:

        @property
        def storage(self) -> TaskStorage: ...

        @property
        def clock(self) -> Clock: ...

    def request_stack(self, task_id: str) -> str:
        """Ask the worker running task ``task_id``'s handler for the handler's current Python
        stack; returns the request's id, for ``task_stack``. The worker answers within about
        a second (its heartbeat thread looks for requests while it runs tasks). Asked again
        while a request for the task made within REUSE_SECONDS is unanswered, returns that
        request's id and stores nothing (asking in a loop piles up no requests). Raises
        TaskNotRunningError, storing nothing, when the task is not found or no handler of it
        runs (a RUNNING task, or one that timed out while its handler runs on)."""
        task = self.storage.get(task_id) if storable_id(task_id) else None
        if task is None:
            raise TaskNotRunningError(f"no task has the id {task_id!r}")
        running = task.status is TaskStatus.RUNNING or task.handler_running
        if not running or task.worker_id is None:
            raise TaskNotRunningError(
                f"task {task_id!r} is {task.status.value}, and no handler of it is running: "
                "only a running handler has a live stack"
            )
        request = StackRequest(uuid.uuid4().hex, task_id, task.worker_id, self.clock.now())
        # An unanswered request for the task made within REUSE_SECONDS: its id instead.
        return self.storage.add_stack_request(request)

    def task_stack(self, task_id: str, request_id: str) -> StackAnswer | None:
        """The worker's answer to ``request_stack``'s request ``request_id`` for ``task_id``;
        None while it has not answered yet. Once no handler of the task runs on that worker
        any more (it ended before its worker answered, or runs on another worker now), an
        answer saying so (``running`` False, ``where`` naming its status), stored as the
        request's answer: a worker with nothing left to run never looks for requests. Raises
        StackNotAnsweredError, naming the worker, once ANSWER_SECONDS passed without an answer
        (the worker is gone or frozen), and for a request that is unknown, expired (kept
        KEEP_SECONDS) or made for another task."""
        found = None
        if isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id):
            found = self.storage.get_stack_request(request_id)
        if found is None or found.task_id != task_id:
            raise StackNotAnsweredError(
                f"no stack request {request_id!r} for task {task_id!r}: requests are kept "
                f"{KEEP_SECONDS:g} s"
            )
        if found.answer is not None:
            return found.answer
        ended = self._ended_first(found)
        if ended is not None:
            return ended
        waited = (self.clock.now() - found.requested_at).total_seconds()
        if waited < ANSWER_SECONDS:
            return None
        seen = self.storage.worker_last_seen(found.worker_id)
        last = (
            "it is not in the worker registry"
            if seen is None
            else f"its last heartbeat was {(self.clock.now() - seen).total_seconds():.1f} s ago"
        )
        raise StackNotAnsweredError(
            f"worker {found.worker_id} did not answer within {ANSWER_SECONDS:g} s ({last}): "
            "it is gone, frozen (a stopped process, or a handler holding the GIL), or cannot "
            "reach the storage"
        )

    def _ended_first(self, request: StackRequest) -> StackAnswer | None:
        """The answer to an unanswered request whose task no longer runs a handler on the
        request's worker (None while it does); stored, unless the worker answered meanwhile
        (then its answer)."""
        task = self.storage.get(request.task_id)
        running = task is not None and (task.status is TaskStatus.RUNNING or task.handler_running)
        if running and task is not None and task.worker_id == request.worker_id:
            return None
        if running and task is not None:
            where = f"its handler runs on worker {task.worker_id} now (a new attempt): ask again"
        else:
            where = ENDED_FIRST.format(status="purged" if task is None else task.status.value)
        answer = StackAnswer(
            request_id=request.request_id,
            task_id=request.task_id,
            worker_id=request.worker_id,
            answered_at=self.clock.now(),
            running=False,
            where=where,
        )
        if self.storage.answer_stack(answer):
            return answer
        again = self.storage.get_stack_request(request.request_id)
        return again.answer if again is not None and again.answer is not None else answer
