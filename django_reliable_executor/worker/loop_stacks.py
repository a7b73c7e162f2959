"""Reading an async handler's coroutine frames on its event loop's thread, from another one."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Most seconds a stack answer waits for an event loop to read its coroutines' frames.
LOOP_WAIT_SECONDS = 0.5


class LoopBusy(Exception):
    """The loop did not get to the read in time: a handler blocks it (a synchronous call)."""


def read_on_loop(loop: asyncio.AbstractEventLoop, read: Callable[[], T], timeout: float) -> T:
    """``read()`` run on ``loop``'s thread between two of its callbacks, where no coroutine
    moves (walking a coroutine's frames from another thread could see one half way through
    a step); what it returns or raises. LoopBusy once ``timeout`` seconds passed (the read
    is then dropped, never run late); RuntimeError when the loop is closed."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def call() -> None:
        if not future.set_running_or_notify_cancel():  # the asker gave up waiting
            return
        try:
            future.set_result(read())
        except Exception as exc:  # to the asker, never into the loop
            future.set_exception(exc)

    loop.call_soon_threadsafe(call)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise LoopBusy from None
