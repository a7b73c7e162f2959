"""Child: one child process of the process pool and the worker's end of its pipe (the
child's own side is process_child.py)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from multiprocessing.connection import wait
from typing import Any

from ..core.serialization import dumps
from . import process_child

GRACE_SECONDS = 1.0  # between SIGTERM and SIGKILL of a child that is stopped
CHILD_DIED = "the child process running the handler died"
# Most stack requests a child is sent and has not answered (Child.ask_stack).
MAX_STACKS_ASKED = 4


class ChildDied(Exception):
    """The child exited (or its pipe broke) before it answered."""


def describe_exit(exitcode: int | None) -> str:
    """How a child ended: ``killed by signal SIGSEGV (exit code -11)``, ``exit code 3``."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"killed by signal {name} (exit code {exitcode})"
    return f"exit code {exitcode}"


class Child:
    """One child process and the worker's end of its pipe."""

    def __init__(self, context: Any, settings_module: str) -> None:
        parent_end, child_end = context.Pipe()
        self.process = context.Process(
            target=process_child.main,
            args=(child_end, settings_module, os.getpid()),
            name="reliable-executor-child",
        )
        self.process.start()
        child_end.close()  # the child holds it: EOF here once the child is gone
        self.conn = parent_end
        self.tasks = 0  # tasks sent to it
        self.ready = False  # it said so: Django is set up there
        # Sends come from its pool thread (tasks) and the heartbeat thread (stack requests).
        self._send_lock = threading.Lock()
        # Stack requests sent and not answered yet: a child that cannot read its pipe (stopped,
        # or a C call holding its GIL) gets no more, so the pipe never fills and the heartbeat
        # thread, which sends them, never blocks on it (its leases would lapse).
        self.stacks_asked: set[str] = set()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.is_alive()

    def send(self, message: dict[str, Any]) -> None:
        try:
            with self._send_lock:
                self.conn.send_bytes(dumps(message).encode())
        except OSError as exc:
            raise ChildDied(f"{CHILD_DIED} before it got the task: {self._exit()}") from exc
        self.tasks += 1

    def ask_stack(self, request_id: str, task_id: str) -> bool:
        """Ask the child for the stack of the handler it runs (its reader thread answers
        with a "stack" reply, which the pool thread waiting on it passes on). False when the
        pipe is closed. Sent once per request, at most MAX_STACKS_ASKED unanswered."""
        message = {"stack": request_id, "task_id": task_id}
        try:
            with self._send_lock:
                if request_id in self.stacks_asked or len(self.stacks_asked) >= MAX_STACKS_ASKED:
                    return True  # asked already, or busy: left unanswered (its page says so)
                self.stacks_asked.add(request_id)
                self.conn.send_bytes(dumps(message).encode())
        except OSError:
            return False
        return True

    def stack_answered(self, request_id: str) -> None:
        """The child's reply to stack request ``request_id`` was read."""
        with self._send_lock:
            self.stacks_asked.discard(request_id)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The child's reply, or None if none came within ``timeout``; ChildDied if it died.
        The message a new child sends once set up is taken here, as no reply."""
        if not wait([self.conn, self.process.sentinel], timeout):
            return None
        if self.conn.poll(0):  # a reply sent just before the child exited still counts
            try:
                reply: dict[str, Any] = json.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                pass
            else:
                if reply["status"] != "ready":
                    return reply
                self.ready = True
                return None
        raise ChildDied(f"{CHILD_DIED}: {self._exit()}")

    def wait_ready(self, timeout: float) -> None:
        """Block until the child has set Django up; ChildDied if it could not."""
        ends = time.monotonic() + timeout
        while not self.ready:
            left = ends - time.monotonic()
            if left <= 0:
                raise ChildDied(f"the child process {self.pid} was not set up in {timeout:g}s")
            if self.receive(left) is not None:
                raise ChildDied(f"the child process {self.pid} answered before it was set up")

    def _exit(self) -> str:
        self.process.join(GRACE_SECONDS)
        return describe_exit(self.process.exitcode)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after GRACE_SECONDS; reaped either way."""
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(GRACE_SECONDS)
            if self.process.is_alive():
                self.process.kill()
        self.process.join()
        self.conn.close()

    def retire(self) -> None:
        """An idle child: close its pipe, which it takes as the sign to exit."""
        self.conn.close()
        self.process.join(GRACE_SECONDS)
        self.stop()
