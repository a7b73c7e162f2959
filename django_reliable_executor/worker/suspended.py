"""Suspended: how a durable wait, or a step as its worker stops, stops a handler."""

from __future__ import annotations

from ..core.waits import Wait


class Suspended(BaseException):  # noqa: N818 - not an error: the handler stops to wait
    """Raised by a durable wait to stop its handler there: the worker hands the task back to
    wait (``wait``), or, with None, to be resumed at once (a stop at a step, on SIGTERM).
    A BaseException, so that a handler's ``except Exception`` lets it through."""

    def __init__(self, wait: Wait | None) -> None:
        super().__init__(wait.name if wait is not None else "stop")
        self.wait = wait
