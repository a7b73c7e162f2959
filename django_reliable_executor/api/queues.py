"""JSON views of the paused queues: list them, pause and resume one, through the service."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse

from ..exceptions import InvalidQueueError, UnknownQueueError
from ..service.reliable_executor import executor
from .tasks import OPERATE, VIEW, api_view, error


@api_view("GET", VIEW)
def paused(request: HttpRequest) -> HttpResponse:
    """GET: ``{"paused_queues": [...]}``, sorted."""
    return JsonResponse({"paused_queues": sorted(executor.paused_queues())})


def _change(queue: str, action: Callable[[str], bool], paused: bool) -> HttpResponse:
    """Pause or resume: 200 ``{"queue", "paused", "changed"}`` (changed false when it already
    was so), 400 for a name breaking the queue rule, 404 for a queue nothing uses."""
    try:
        changed = action(queue)
    except UnknownQueueError as exc:
        return error(404, str(exc), exc.field)
    except InvalidQueueError as exc:
        return error(400, str(exc), exc.field)
    return JsonResponse({"queue": queue, "paused": paused, "changed": changed})


@api_view("POST", OPERATE)
def pause(request: HttpRequest, queue: str) -> HttpResponse:
    """POST: stop every worker claiming from the queue (its tasks wait; submits accepted)."""
    return _change(queue, executor.pause_queue, True)


@api_view("POST", OPERATE)
def resume(request: HttpRequest, queue: str) -> HttpResponse:
    """POST: let workers claim from the queue again; idle workers are woken."""
    return _change(queue, executor.resume_queue, False)
