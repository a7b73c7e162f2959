"""JSON view: send an event to a task (``executor.send_event``), which its durable
``context.wait_for_event`` of that name returns."""

from __future__ import annotations

import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from ..core.steps import check_step_name
from ..service.reliable_executor import executor
from .tasks import OPERATE, BadRequest, _shown, api_view, error, json_object


def parse_event(request: HttpRequest) -> Any:
    """The payload of an event's body: none (null); a JSON object with at most the field
    ``payload`` (any JSON value); or a form with at most that field, its value JSON text.
    Raises BadRequest."""
    form = request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded")
    if form:
        data: dict[str, Any] = dict(request.POST.items())
    elif not request.body.strip():
        return None
    else:
        data = json_object(request.body)
    unknown = sorted(set(data) - {"payload"})
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; an event takes payload", unknown[0])
    if not form:
        return data.get("payload")
    if not data.get("payload", "").strip():  # an empty form field: no payload
        return None
    try:
        return json.loads(data["payload"])
    except ValueError as exc:
        raise BadRequest(f"payload is not JSON: {exc}", "payload") from None


@api_view("POST", OPERATE)
def send(request: HttpRequest, task_id: str, name: str) -> HttpResponse:
    """POST: send event ``name`` to the task, with the body's ``payload`` (JSON; none: null).
    The first payload sent under a name is kept. 404 for an unknown task, 409 for a terminal
    one (nothing stored), 400 for a name or payload that cannot be one."""
    if executor.get_task(task_id) is None:
        return error(404, f"no task {task_id!r}", "task_id")
    try:
        check_step_name(name, "event name")
        payload = parse_event(request)
    except BadRequest as exc:
        return error(400, str(exc), exc.field)
    except (TypeError, ValueError) as exc:
        return error(400, str(exc), "name")
    try:
        sent = executor.send_event(task_id, name, payload)
    except (TypeError, ValueError) as exc:
        return error(400, str(exc), "payload")
    task = _shown(request, executor.get_task(task_id))
    if not sent:
        return error(409, f"task {task_id!r} has ended: event {name!r} not sent", task=task)
    return JsonResponse({"sent": True, "task": task})
