"""The live-stack half of the storage interface: a request for a running handler's stack, taken
by its worker's heartbeat thread, and the answer it stores (core/stacks.py)."""

from __future__ import annotations

import abc
import builtins

from ..core.stacks import StackAnswer, StackRequest


class StackStorage(abc.ABC):
    """Requests and answers of "Show stack"; both expire after KEEP_SECONDS."""

    #: take_stack_requests() blocks until a request comes (Redis); otherwise the worker polls.
    blocking_stack_wait: bool = False

    @abc.abstractmethod
    def add_stack_request(self, request: StackRequest) -> str:
        """Store a request for the stack of a running task's handler, for its worker
        (``request.worker_id``) to take; requests and answers expire after KEEP_SECONDS.
        Returns the id of the request to wait for: ``request``'s, or that of an unanswered
        request for the same task and worker made within REUSE_SECONDS, when there is one
        (nothing is stored then: repeated asking piles up no requests)."""

    @abc.abstractmethod
    def take_stack_requests(self, worker_id: str, timeout: float) -> builtins.list[StackRequest]:
        """The unanswered requests made for ``worker_id`` within TAKE_WITHIN_SECONDS (at
        most TAKE_LIMIT), oldest first. Where ``blocking_stack_wait``, blocks up to
        ``timeout`` seconds until one comes (0: never blocks), and a request is taken once;
        elsewhere returns at once, and a request is taken again until answered."""

    @abc.abstractmethod
    def answer_stack(self, answer: StackAnswer) -> bool:
        """Store the worker's answer to request ``answer.request_id``: False when that
        request expired or was answered already (nothing changes)."""

    @abc.abstractmethod
    def get_stack_request(self, request_id: str) -> StackRequest | None:
        """The request with its answer, if any; None once it expired (or never was)."""
