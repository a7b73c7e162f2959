"""A process pool's child: sets Django up, then runs the handlers its worker sends, one at a time.

The child only runs handlers. It never claims, starts, heartbeats or records a task: the worker
process does all of that, so whatever a handler does here (hold the GIL, crash, hang) cannot
cost the worker its leases. The one write made here is a durable step's checkpoint
(``context.step``), on the child's own connection: under the claim's token, which the task
message carries, so that an ``atomic=True`` step's checkpoint commits in the transaction of the
handler's own ORM writes (a child terminated meanwhile rolls both back).

Everything crossing the pipe is JSON text, both ways (never pickle): the task (a TaskInfo, its
parameter as stored, and the claim's token), then the outcome (the result as JSON, or the
error with its traceback). Before the outcome, the handler's progress reports: coalesced here
as the worker does (at most one a second, the last one always sent before the outcome).
A reader thread takes the worker's messages: tasks go to the main thread, which runs them;
a stack request (the worker's heartbeat relays it: worker/stacks.py) is answered by the reader
at once, with the main thread's frames, this process's pid and resident memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import inspect
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from ..connections import tidy_connections
from ..core.progress import Progress, progress_to_json
from ..core.records import Claim, TaskInfo
from ..core.serialization import ConversionError, dumps, encode, from_json_value
from ..core.stacks import format_coroutine_stack, format_stack
from ..core.task_json import task_from_json
from ..core.text import storable_text
from ..observability.attempts import in_child
from ..registry import resolve_handler
from ..service.reliable_executor import executor
from .context import TaskContext
from .failures import RESULT_REFUSED
from .loop_stacks import LOOP_WAIT_SECONDS, LoopBusy, read_on_loop
from .progress_writer import ProgressWriter
from .steps import Checkpoints
from .suspended import Suspended
from .waits import wait_to_json

PARENT_CHECK_SECONDS = 1.0
_STOPPING = threading.Event()  # set by the worker's SIGUSR1 (ProcessPool.stop_at_steps)
_RUNNING: list[str | None] = [None]  # the id of the task the main thread runs (or None)
# The loop and asyncio task of the async handler the main thread awaits (or None): a stack
# request reads that coroutine's frames on the loop (``_handler_stack``).
_ON_LOOP: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None] = [None]


def main(conn: Any, settings_module: str, parent_pid: int) -> None:
    """The child process's entry point: set Django up, then answer one task message after
    the other until the worker closes the pipe (or dies)."""
    # Ctrl-C in a terminal reaches the whole process group: the worker decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The worker stops: the running handler's next durable step hands its task back.
    signal.signal(signal.SIGUSR1, lambda signum, frame: _STOPPING.set())
    os.environ["DJANGO_SETTINGS_MODULE"] = settings_module
    import django

    django.setup()
    _exit_with_parent(parent_pid)
    send = _sender(conn)
    send({"status": "ready"})
    progress: ProgressWriter[dict[str, Any]] = ProgressWriter(
        lambda messages: [send(message) for message in messages],
        name="reliable-executor-child-progress",
    )
    inbox = _reader(conn, send, threading.get_ident())
    while True:
        message = inbox.get()
        if message is None:
            break  # the worker closed the pipe: retired, or stopping
        task_id = message["task"]["task_id"]
        _RUNNING[0] = task_id
        try:
            reply = run_task(
                message,
                functools.partial(_report, progress, task_id),
                lambda name: send({"status": "step", "name": name}),
            )
        finally:
            _RUNNING[0] = None
            progress.finish(task_id)  # the last report goes before the outcome
            tidy_connections()
        try:
            send(reply)
        except OSError:
            break
    from django.db import connections

    connections.close_all()


def _reader(
    conn: Any, send: Callable[[dict[str, Any]], None], main_thread: int
) -> queue.SimpleQueue[dict[str, Any] | None]:
    """Read the worker's messages on a thread of their own: a stack request is answered
    there at once (the main thread is busy running the handler), a task is queued for the
    main thread; None once the pipe is closed."""
    inbox: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

    def read() -> None:
        while True:
            try:
                message = json.loads(conn.recv_bytes())
            except (EOFError, OSError):
                inbox.put(None)
                return
            if "stack" not in message:
                inbox.put(message)
                continue
            try:
                reply = _stack_reply(message, main_thread)
            except Exception as exc:  # never at the cost of this thread: tasks come through it
                reply = _unreadable_stack(message, exc)
            with contextlib.suppress(OSError):  # the worker is gone: the main thread sees it
                send(reply)

    threading.Thread(target=read, name="reliable-executor-child-reader", daemon=True).start()
    return inbox


def _stack_reply(message: dict[str, Any], main_thread: int) -> dict[str, Any]:
    """The answer to a stack request: the main thread's frames while it runs the task asked
    about (file, line, function and source line only, never locals), this process's pid and
    resident memory."""
    running = _RUNNING[0] == message["task_id"]
    stack, truncated = _handler_stack(main_thread, running)
    return {
        "status": "stack",
        "request_id": message["stack"],
        "task_id": message["task_id"],
        "running": running,
        "stack": stack,
        "truncated": truncated,
        "pid": os.getpid(),
        "rss_bytes": resident_bytes(),
    }


def _handler_stack(main_thread: int, running: bool) -> tuple[str, bool]:
    """The handler's frames (none unless ``running``): an async one's coroutine frames, read
    on its loop; else (or when a synchronous call blocks that loop) the main thread's."""
    on_loop = _ON_LOOP[0]
    if running and on_loop is not None:
        loop, task = on_loop
        with contextlib.suppress(LoopBusy, RuntimeError):  # blocked, or just ended
            return read_on_loop(
                loop, lambda: format_coroutine_stack(task.get_coro()), LOOP_WAIT_SECONDS
            )
    return format_stack(sys._current_frames().get(main_thread) if running else None)


def _unreadable_stack(message: dict[str, Any], exc: Exception) -> dict[str, Any]:
    """The answer to a stack request whose frames could not be formatted: why, in words."""
    why = storable_text(f"(the stack could not be read: {type(exc).__name__}: {exc})")
    return {
        "status": "stack",
        "request_id": message.get("stack"),
        "task_id": message.get("task_id"),
        "running": _RUNNING[0] is not None and _RUNNING[0] == message.get("task_id"),
        "stack": why,
        "truncated": False,
        "pid": os.getpid(),
        "rss_bytes": resident_bytes(),
    }


def resident_bytes() -> int | None:
    """This process's resident memory (RSS), from /proc/self/statm; None without /proc."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _sender(conn: Any) -> Callable[[dict[str, Any]], None]:
    """Sends a message to the worker: from this thread (outcomes) or the progress writer's."""
    lock = threading.Lock()

    def send(message: dict[str, Any]) -> None:
        with lock:
            conn.send_bytes(dumps(message).encode())

    return send


def _report(writer: ProgressWriter[dict[str, Any]], task_id: str, progress: Progress) -> None:
    writer.put(task_id, {"status": "progress", "progress": progress_to_json(progress)})


def _exit_with_parent(parent_pid: int) -> None:
    """A child whose worker died (kill -9) must not run on: its task is recovered and run
    again elsewhere after the lease expires. The check runs between handler bytecodes, so a
    handler holding the GIL in one C call delays it until that call returns."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(1)

    threading.Thread(target=watch, name="reliable-executor-parent-watch", daemon=True).start()


def run_task(
    message: dict[str, Any],
    report: Callable[[Progress], object] | None = None,
    on_step: Callable[[str], object] | None = None,
) -> dict[str, Any]:
    """Run one task's handler: {"status": "ok", "result": ...}, "suspend" with its wait, or
    "error" with the error text and whether it is retryable. ``report`` takes the handler's
    progress reports, ``on_step`` the name of each checkpoint it wrote."""
    task = task_from_json(message["task"])
    handler = resolve_handler(task.task_name)
    if handler is None:
        return _error(f"no handler is registered for task name {task.task_name!r} in the child")
    try:
        parameter = from_json_value(task.parameter, handler.param_type)
    except ConversionError as exc:
        return _error(f"parameter does not fit param_type: {exc}")
    args = (parameter,) if handler.accepts_parameter else ()
    kwargs: dict[str, Any] = {}
    if handler.takes_context:
        deadline = message.get("deadline_at")
        deadline_at = dt.datetime.fromisoformat(deadline) if deadline else None
        kwargs["context"] = TaskContext(
            task,
            deadline_at,
            executor,
            report,
            _checkpoints(message, task, deadline_at, on_step),
            asynchronous=handler.is_async,
        )
    try:
        with in_child(task, message.get("run_span")):
            value = handler.func(*args, **kwargs)
            if inspect.isawaitable(value):  # an async handler here runs on a loop of its own

                async def wait(awaitable: Any = value) -> Any:
                    current = asyncio.current_task()
                    assert current is not None
                    _ON_LOOP[0] = (asyncio.get_running_loop(), current)
                    try:
                        return await awaitable
                    finally:
                        _ON_LOOP[0] = None

                value = asyncio.run(wait())
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, never lost
        if isinstance(exc, Suspended):  # a durable wait: the worker hands the task back
            return {"status": "suspend", "wait": wait_to_json(exc.wait)}
        return _error(traceback.format_exc(), retryable=isinstance(exc, handler.retry_on))
    try:
        return {"status": "ok", "result": encode(value).value}
    except ConversionError as exc:
        return _error(f"{RESULT_REFUSED}: {exc}")
    except Exception as exc:  # a model_dump() that raises, say
        return _error(f"{RESULT_REFUSED}: {type(exc).__name__}: {exc}")


def _checkpoints(
    message: dict[str, Any],
    task: TaskInfo,
    deadline_at: dt.datetime | None,
    on_step: Callable[[str], object] | None = None,
) -> Checkpoints | None:
    """The durable steps of the task's attempt, written under the claim the message names (a
    worker of an earlier version sends none: its handlers' steps then raise)."""
    claim = message.get("claim")
    if claim is None:
        return None
    held = Claim(
        task=task,
        token=int(claim["token"]),
        budget_attempts=0,  # not read by a checkpoint's write
        deadline_at=deadline_at,
        shard=int(claim.get("shard", 0)),
    )
    lease_seconds = float(message["lease_seconds"])
    return Checkpoints(held, executor, lease_seconds, _STOPPING.is_set, on_step)


def _error(error: str, *, retryable: bool = False) -> dict[str, Any]:
    # Made storable here: a lone surrogate could not even be sent over the pipe (UTF-8).
    return {"status": "error", "error": storable_text(error), "retryable": retryable}
