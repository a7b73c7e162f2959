"""The task page's "Show stack": a small JSON endpoint that asks a running task's worker for its
handler's live stack (POST) and reports the answer (GET ``?request=<id>``), polled by the page.

Permission: ``view_reliabletask``, as the page itself. A stack shows code paths (each frame's
file, line, function and source line), never variables, parameters or results, and asking for
one changes no task: it is reading, not acting (docs/admin.md).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, path

from ..core.stacks import StackAnswer
from ..exceptions import StackNotAnsweredError, StorageUnavailableError, TaskNotRunningError
from .base import ServiceModelAdmin
from .task_pages import format_duration


class StackViews(ServiceModelAdmin):
    """Mixed into the task admin: the URL and view of the stack endpoint."""

    def _stack_url(self) -> URLPattern:
        return path(
            "stack/<path:task_id>/",
            self.admin_site.admin_view(self.stack_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_stack",
        )

    def stack_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        """POST: request the stack of task ``task_id``'s handler ({"state": "requested",
        "request_id"}, or "refused" with the error, 409). GET ``?request=<id>``: "waiting",
        "answered" (with what stack_json gives) or "no_answer" with why."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        task_id = unquote(task_id)
        try:
            if request.method == "POST":
                return _request(self, task_id)
            return _report(self, task_id, request.GET.get("request", ""))
        except StorageUnavailableError as exc:
            return JsonResponse({"state": "unavailable", "error": str(exc)}, status=503)


def _request(admin: ServiceModelAdmin, task_id: str) -> JsonResponse:
    try:
        request_id = admin.executor.request_stack(task_id)
    except TaskNotRunningError as exc:
        return JsonResponse({"state": "refused", "error": str(exc)}, status=409)
    return JsonResponse({"state": "requested", "request_id": request_id}, status=202)


def _report(admin: ServiceModelAdmin, task_id: str, request_id: str) -> JsonResponse:
    try:
        answer = admin.executor.task_stack(task_id, request_id)
    except StackNotAnsweredError as exc:
        return JsonResponse({"state": "no_answer", "error": str(exc)})
    if answer is None:
        return JsonResponse({"state": "waiting"})
    return JsonResponse({"state": "answered", **stack_json(answer)})


def stack_json(answer: StackAnswer) -> dict[str, Any]:
    """What the page shows of an answer: the stack, whether it was cut, and its facts as
    ``[label, text]`` rows (where it runs, how long the attempt has run against its deadline
    and attempt_timeout, the child's memory)."""
    facts: list[list[str]] = [["Worker", answer.worker_id]]
    if answer.where:
        facts.append(["Where", answer.where])
    if answer.elapsed_seconds is not None:
        facts.append(["Running for", format_duration(dt.timedelta(seconds=answer.elapsed_seconds))])
    facts.append(["Deadline", _deadline(answer)])
    facts.append(["Attempt timeout", _attempt_timeout(answer)])
    if answer.rss_bytes is not None:
        facts.append(["Memory (RSS)", f"{answer.rss_bytes / 2**20:.1f} MiB"])
    facts.append(["Answered", answer.answered_at.strftime("%Y-%m-%d %H:%M:%S UTC")])
    return {
        "running": answer.running,
        "stack": answer.stack,
        "truncated": answer.truncated,
        "rss_bytes": answer.rss_bytes,
        "elapsed_seconds": answer.elapsed_seconds,
        "facts": facts,
    }


def _deadline(answer: StackAnswer) -> str:
    """The max_duration deadline and how far off it was when the worker answered."""
    if answer.deadline_at is None:
        return "none (no max_duration_millis)"
    left = answer.deadline_at - answer.answered_at
    when = answer.deadline_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    if left.total_seconds() < 0:
        return f"{when}, passed {format_duration(-left)} ago"
    return f"{when}, in {format_duration(left)}"


def _attempt_timeout(answer: StackAnswer) -> str:
    """The attempt's limit, and how much of it is left."""
    if answer.attempt_timeout is None:
        return "none"
    limit = format_duration(dt.timedelta(seconds=answer.attempt_timeout))
    if answer.elapsed_seconds is None:
        return limit
    left = dt.timedelta(seconds=answer.attempt_timeout - answer.elapsed_seconds)
    if left.total_seconds() < 0:
        return f"{limit}, passed {format_duration(-left)} ago"
    return f"{limit}, {format_duration(left)} left"
