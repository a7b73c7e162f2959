"""Live stacks on the database storage: a row per request in reliable_executor_stack_request."""

from __future__ import annotations

import datetime as dt

from ...core.stacks import (
    KEEP_SECONDS,
    REUSE_SECONDS,
    TAKE_LIMIT,
    TAKE_WITHIN_SECONDS,
    StackAnswer,
    StackRequest,
    answer_from_json,
    answer_to_json,
)
from ...models import ReliableStackRequest
from .access import DatabaseAccess


class Stacks(DatabaseAccess):
    """add_stack_request, take_stack_requests, answer_stack, get_stack_request. A worker
    running tasks polls for its requests (at most once per POLL_SECONDS, from its heartbeat
    thread: one indexed SELECT on a table of a few rows); each request deletes the rows past
    KEEP_SECONDS, so the table holds at most the requests of the last KEEP_SECONDS."""

    def add_stack_request(self, request: StackRequest) -> str:
        rows = ReliableStackRequest.objects.using(self.alias)
        rows.filter(requested_at__lt=self.clock.now() - dt.timedelta(seconds=KEEP_SECONDS)).delete()
        # One unanswered request per task and REUSE_SECONDS (the worker's index finds it). Two
        # viewers asking at the same instant may both store one: the bound is per asker.
        waiting = (
            rows.filter(
                worker_id=request.worker_id,
                requested_at__gte=request.requested_at - dt.timedelta(seconds=REUSE_SECONDS),
                task_id=request.task_id,
                answered_at__isnull=True,
            )
            .order_by("-requested_at")
            .values_list("request_id", flat=True)
            .first()
        )
        if waiting is not None:
            return str(waiting)
        rows.create(
            request_id=request.request_id,
            task_id=request.task_id,
            worker_id=request.worker_id,
            requested_at=request.requested_at,
        )
        return request.request_id

    def take_stack_requests(self, worker_id: str, timeout: float) -> list[StackRequest]:
        # Never blocks (blocking_stack_wait is False): the heartbeat waits between polls.
        since = self.clock.now() - dt.timedelta(seconds=TAKE_WITHIN_SECONDS)
        rows = (
            ReliableStackRequest.objects.using(self.alias)
            .filter(worker_id=worker_id, requested_at__gte=since, answered_at__isnull=True)
            .order_by("requested_at")
            .values_list("request_id", "task_id", "requested_at")[:TAKE_LIMIT]
        )
        return [
            StackRequest(request_id, task_id, worker_id, requested_at)
            for request_id, task_id, requested_at in rows
        ]

    def answer_stack(self, answer: StackAnswer) -> bool:
        rows = ReliableStackRequest.objects.using(self.alias).filter(
            pk=answer.request_id, answered_at__isnull=True
        )
        return bool(rows.update(answered_at=answer.answered_at, answer=answer_to_json(answer)))

    def get_stack_request(self, request_id: str) -> StackRequest | None:
        row = ReliableStackRequest.objects.using(self.alias).filter(pk=request_id).first()
        if row is None:
            return None
        return StackRequest(
            row.request_id,
            row.task_id,
            row.worker_id,
            row.requested_at,
            answer_from_json(row.answer) if row.answer is not None else None,
        )
