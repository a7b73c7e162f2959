"""How the worker stops an async handler's coroutine: on a cancel request, at the task's
deadline, at its attempt_timeout; and its SystemExit kept from ending the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

from .attempt_limits import log_attempt_expired
from .context import TaskContext
from .runner import Begun

CANCELLED = (
    "cancelled by the worker: a cancel was requested, the task timed out or this attempt "
    "lost its lease"
)
TIMED_OUT = "timeout"
ATTEMPT_TIMED_OUT = "attempt_timeout"
# The loop's timers may fire a hair before the wall clock reaches the deadline; the storage
# records TIMEOUT only past it.
DEADLINE_MARGIN = 0.005


class HandlerExit(Exception):
    """A handler's SystemExit or KeyboardInterrupt, carried as an ordinary exception: asyncio
    lets those two out of ``run_forever`` (ending the loop's thread), any other it keeps in the
    task that raised it."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


async def contained(awaitable: Any) -> Any:
    """Await a handler's coroutine, its SystemExit or KeyboardInterrupt turned HandlerExit."""
    try:
        return await awaitable
    except (SystemExit, KeyboardInterrupt) as exc:
        raise HandlerExit(exc) from None


def arm_stops(
    loop: asyncio.AbstractEventLoop,
    handler_task: asyncio.Task[Any],
    begun: Begun,
    context: TaskContext | None,
    seconds: float | None,
    stopped: list[str],
    timers: list[asyncio.TimerHandle],
    now: dt.datetime,
) -> None:
    """Have the handler's coroutine cancelled on a cancel request (from any thread), at the
    task's deadline and at its attempt_timeout, noting why in ``stopped``; the timers go to
    ``timers``, for the caller to cancel once the handler ended."""
    claim = begun.claim

    def stop(why: str) -> None:
        if not handler_task.done() and not stopped:
            stopped.append(why)
            handler_task.cancel()

    def stop_soon() -> None:  # from the heartbeat's thread, say
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(stop, CANCELLED)

    if context is not None:
        context.on_cancel(stop_soon)
    if claim.deadline_at is not None:
        left = (claim.deadline_at - now).total_seconds()
        timers.append(loop.call_later(max(left, 0) + DEADLINE_MARGIN, stop, TIMED_OUT))
    if seconds is not None:

        def expire(seconds: float = seconds) -> None:
            if handler_task.done() or stopped:  # returned in time, or stopped already
                return
            log_attempt_expired(claim, seconds, "cancelling its coroutine")
            stop(ATTEMPT_TIMED_OUT)
            if context is not None:  # is_cancelled() True (its stop_soon: a no-op)
                context.mark_cancelled()

        timers.append(loop.call_later(seconds, expire))
