"""FailureRecorder: records a failed attempt (a handler's error, an attempt past its
attempt_timeout, a result the storage refused, a task that cannot run here) fenced by the
claim's token, never lost for its text, retried on a new connection while the storage is out
of reach; hands a task back to wait (a durable wait, or a stop at a step); and reports a
discarded outcome."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from ..connections import out_of_reach, with_reconnect
from ..core.records import Claim, Transition
from ..core.retries import attempt_timeout_message
from ..core.serialization import RESULT_REFUSED
from ..core.states import TaskStatus
from ..core.text import ascii_text, storable_text
from ..core.waits import Wait
from ..observability.attempts import Attempt, observe
from ..service.reliable_executor import ReliableExecutor

logger = logging.getLogger("django_reliable_executor")
__all__ = ["RESULT_REFUSED", "FailureRecorder"]


class FailureRecorder:
    """The failure writes of one worker's TaskRunner."""

    def __init__(self, executor: ReliableExecutor, lease_seconds: float) -> None:
        self.executor = executor
        self.lease_seconds = lease_seconds

    @property
    def storage(self) -> Any:
        return self.executor.storage

    @property
    def _alias(self) -> str | None:
        """The task database's alias (see connections.out_of_reach); None on Redis."""
        alias: str | None = self.storage.transaction_alias
        return alias

    def record_timed_out(
        self, claim: Claim, seconds: float, what_happened: str, attempt: Attempt | None = None
    ) -> TaskStatus | None:
        """Record an attempt that ran past its attempt_timeout: a failed attempt, retryable
        whatever the handler raised (retry_on does not apply: the worker ended it, as a lost
        worker's attempt); a cancel requested meanwhile, or the task's deadline, still wins
        (the storage decides, as for any failure)."""
        error = attempt_timeout_message(seconds, what_happened)
        if attempt is not None:
            attempt.failed(error=error.splitlines()[0])
        return self.record_failure(claim, error, True)

    def suspend(
        self, claim: Claim, wait: Wait | None, attempt: Attempt | None = None
    ) -> TaskStatus | None:
        """Hand the claim's task back to wait (``wait``) or to be resumed now (None: the
        worker stops); PENDING, or None when the claim was no longer ours. Refused because a
        cancel was requested meanwhile, it is recorded as a failure, which ends it CANCELLED."""
        transition = self.while_in_reach(
            lambda: self.storage.suspend(claim, wait), claim, "its wait"
        )
        if transition is None:
            what = "a stop" if wait is None else f"its wait {wait.name!r}"
            return self.record_failure(claim, f"stopped at {what}; a cancel was requested", True)
        if attempt is not None:
            attempt.suspended(wait)
        self.executor.announcer.suspended(transition, wait)
        return TaskStatus.PENDING

    def refuse_result(self, claim: Claim, exc: BaseException) -> Transition | None:
        """The storage refused this task's result (too large for it, say): the task fails
        alone, without retries, and the other completions are written."""
        error = storable_text(f"{RESULT_REFUSED}: {exc}")  # the refusal may quote the result
        logger.error("task %s (%s): %s", claim.task_id, claim.task.task_name, error)
        return self._fail(claim, error, retryable=False)

    def _fail(
        self, claim: Claim, error: str, *, retryable: bool, is_error: bool = False
    ) -> Transition | None:
        """``storage.fail`` with ``error`` made storable first (text.storable_text: a
        handler's message may hold a NUL, say), never lost for its text."""
        error = storable_text(error)
        try:
            return self._fail_while_in_reach(claim, error, retryable, is_error)
        except Exception as exc:
            if error.isascii() or out_of_reach(exc, self._alias):
                raise
            # Perhaps refused for its text (MySQL says OperationalError when a column not in
            # utf8mb4 meets an emoji): record the failure with the text escaped rather than
            # lose it and run the task again. Out of reach, the storage refuses this one too.
            logger.warning(
                "task %s: could not record its failure (%s); trying with its text in ASCII",
                claim.task_id,
                exc,
            )
            error = ascii_text(error)
            return self.storage.fail(claim, error, retryable=retryable, is_error=is_error)

    def _fail_while_in_reach(
        self, claim: Claim, error: str, retryable: bool, is_error: bool
    ) -> Transition | None:
        """``storage.fail``, made again on a new connection while the storage is out of reach
        (see ``while_in_reach``)."""
        return self.while_in_reach(
            lambda: self.storage.fail(claim, error, retryable=retryable, is_error=is_error),
            claim,
            "its failure",
        )

    def while_in_reach(
        self, write: Callable[[], Transition | None], claim: Claim, what: str
    ) -> Transition | None:
        """A fenced write of the claim's outcome (a failure, a durable wait's suspend), made
        again on a new connection while the storage is out of reach (a connection the server
        ended, a server restarting), for up to half a lease: the write is fenced by the
        claim's token, so making it twice is safe, while giving it up would leave the task to
        lease recovery, which runs its handler again. The heartbeat keeps the lease
        meanwhile."""
        give_up_at = time.monotonic() + self.lease_seconds / 2
        pause = 0.05
        while True:
            try:
                return write()
            except Exception as exc:
                if not out_of_reach(exc, self._alias) or time.monotonic() + pause > give_up_at:
                    raise
                logger.warning(
                    "task %s: %s could not be recorded (%s); trying again",
                    claim.task_id,
                    what,
                    exc,
                )
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def record_failure(
        self,
        claim: Claim,
        error: str,
        retryable: bool,
        *,
        is_error: bool = False,
        exc: BaseException | None = None,
    ) -> TaskStatus | None:
        """Record a failed attempt (retry, final failure, TIMEOUT or CANCELLED: the storage
        decides) and announce it; None when the claim was no longer ours. ``exc``: the
        handler's exception, logged with the final failure's line. ``error`` is made
        storable first (see ``_fail``)."""
        transition = self._fail(claim, error, retryable=retryable, is_error=is_error)
        if transition is None:
            self.discarded(claim)
            return None
        self.executor.announcer.transition(transition, exc=exc)
        return transition.status

    def record_error(self, claim: Claim, error: str) -> TaskStatus | None:
        """ERROR: the task cannot run here at all (no handler, unconvertible parameter). Its
        span (when spans are recorded) is a short one, marked ERROR."""
        attempt = observe(claim.task)
        if attempt is None:
            return self.record_failure(claim, error, False, is_error=True)
        with attempt:
            attempt.failed(error=error)
            return self.record_failure(claim, error, False, is_error=True)

    def discarded(self, claim: Claim) -> None:
        """The outcome of ``claim`` was not recorded: the task changed meanwhile. If it ended
        while this handler ran (a TIMEOUT), the handler's return is reported now, so that the
        task ends (its lease let go, its dependents and batch settled, see
        ``TaskStorage.handler_returned``); if this write fails, the lease lapses and the
        master's recovery does the same."""
        logger.warning(
            "task %s (%s): outcome of attempt %s discarded: the task changed meanwhile "
            "(lease lost, timed out or cancelled)",
            claim.task_id,
            claim.task.task_name,
            claim.task.attempts,
        )
        try:
            with_reconnect(lambda: self.storage.handler_returned([claim]))
        except Exception:
            logger.warning(
                "task %s: could not report that its handler returned; its lease lapses "
                "within LEASE_TIMEOUT instead",
                claim.task_id,
                exc_info=True,
            )
