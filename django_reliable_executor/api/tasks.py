"""JSON views: submit and list tasks, get, cancel and retry one task through the service (the
schedule views are in ``schedules``, the queue views in ``queues``)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import json
import re
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from ..core.parameter_filter import checked_parameter, cut_short
from ..core.records import TaskInfo, TaskSubmitRequest
from ..core.steps import check_step_name
from ..core.task_json import task_to_json
from ..exceptions import StorageUnavailableError, TaskSubmitError, UnknownStepError
from ..service.listing import MAX_OFFSET
from ..service.reliable_executor import executor
from .auth import Denied, authorize, may

VIEW = "django_reliable_executor.view_reliabletask"
SUBMIT = "django_reliable_executor.add_reliabletask"
OPERATE = "django_reliable_executor.operate_reliabletask"
SUBMIT_FIELDS = tuple(f.name for f in dataclasses.fields(TaskSubmitRequest))
# GET tasks/: the filters of list_tasks it takes, and its page's size.
LIST_FILTERS = ("status", "task_name", "queue", "batch_id", "tag", "parameter")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
View = Callable[..., HttpResponse]


def error(status: int, message: str, field: str | None = None, **extra: Any) -> JsonResponse:
    """``{"error": message, "field": field, ...}`` with ``status``."""
    return JsonResponse({"error": message, "field": field, **extra}, status=status)


def api_view(method: str, permission: str) -> Callable[[View], View]:
    """Allow one method, authorize the caller, answer refusals and outages as JSON."""
    return api_methods({method: permission})


def api_methods(permissions: dict[str, str]) -> Callable[[View], View]:
    """Allow the methods of ``permissions`` (method -> the permission a session needs for it),
    authorize the caller, answer refusals and outages as JSON."""
    allowed = ", ".join(permissions)

    def decorate(view: View) -> View:
        @csrf_exempt
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            permission = permissions.get(request.method or "")
            if permission is None:
                response = error(405, f"method {request.method} not allowed; use {allowed}")
                response["Allow"] = allowed
                return response
            try:
                authorize(request, permission)
                return view(request, *args, **kwargs)
            except Denied as denied:
                response = error(denied.status, denied.reason)
                if denied.status == 401:
                    response["WWW-Authenticate"] = "Executor-HMAC-SHA256"
                return response
            except StorageUnavailableError as exc:
                return error(503, f"task storage unavailable: {exc}")
            except RequestDataTooBig:
                return error(413, "the body is over DATA_UPLOAD_MAX_MEMORY_SIZE")

        return wrapped

    return decorate


class BadRequest(Exception):
    """A request body the API cannot use: a message and the field it is about, if any."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def json_object(body: bytes) -> dict[str, Any]:
    """The JSON object a body holds; raises BadRequest for anything else."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest("the body is not valid JSON: it is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(data).__name__}")
    return data


def _no_constant(name: str) -> Any:
    # Python's parser takes NaN and Infinity, which JSON has not (nor has any store's JSON).
    raise ValueError(f"{name} is not a JSON value")


def parse_submit(body: bytes) -> TaskSubmitRequest:
    """A TaskSubmitRequest from a JSON object body; raises BadRequest."""
    data = json_object(body)
    unknown = sorted(set(data) - set(SUBMIT_FIELDS))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}", unknown[0])
    if "task_name" not in data:
        raise BadRequest("task_name is required", "task_name")
    if data.get("delay_millis") is None:
        data["delay_millis"] = 0
    if data.get("run_at") is not None:
        data["run_at"] = aware_datetime(data["run_at"], "run_at")
    return TaskSubmitRequest(**data)


def aware_datetime(value: Any, field: str) -> dt.datetime:
    """An ISO 8601 string with a UTC offset as an aware datetime; raises BadRequest."""
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be an ISO 8601 string with a UTC offset", field)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"{field} {value!r} is not an ISO 8601 datetime", field) from None
    if parsed.tzinfo is None:
        raise BadRequest(f"{field} {value!r} has no UTC offset", field)
    return parsed


@api_methods({"POST": SUBMIT, "GET": VIEW})
def submit(request: HttpRequest) -> HttpResponse:
    """POST a TaskSubmitRequest as JSON: 201 with the task stored. When an existing task
    answers (its task_id is taken, or a live task holds its unique key): 201 with that task
    to a caller who may read tasks, else only ``{"existing": true, "task_id": ...}``.
    GET: list tasks newest first (``list_tasks``' filters, ``limit``, ``offset``)."""
    if request.method == "GET":
        try:
            return _list(request)
        except BadRequest as exc:
            return error(400, str(exc), exc.field)
    may_view = may(request, VIEW)
    try:
        submitted = parse_submit(request.body)
        if not may_view and submitted.depends_on is not None and submitted.depends_on != []:
            # Refused before any lookup, whatever the ids: a dependent's handler reads its
            # dependencies' results, and an answer that told "no such task" from "stored"
            # would let a caller who may not read tasks probe which ids exist.
            return error(403, f"permission {VIEW} required to submit with depends_on", "depends_on")
        [(info, created)] = executor.submit_many_created([submitted])
    except BadRequest as exc:
        return error(400, str(exc), exc.field)
    except TaskSubmitError as exc:
        return error(400, str(exc), exc.field)
    if created or may_view:
        return JsonResponse(task_to_json(info), status=201)
    # Another submitter's task: its parameter, result and error are not this caller's to read.
    # Its id only when the caller named it (the holder of a unique key keeps its id unseen).
    own_id = info.task_id if info.task_id == submitted.task_id else None
    return JsonResponse({"existing": True, "task_id": own_id}, status=201)


def _list(request: HttpRequest) -> HttpResponse:
    """``{"tasks": [...]}``: one page of ``list_tasks`` with the query's filters."""
    unknown = sorted(set(request.GET) - {*LIST_FILTERS, "limit", "offset"})
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0]!r}", unknown[0])
    value = functools.partial(query_value, request)
    limit = query_int(request, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    offset = query_int(request, "offset", 0, MAX_OFFSET)
    parameter = query_parameter(request)
    try:
        tasks = executor.list_tasks(
            status=value("status"),
            task_name=value("task_name"),
            queue=value("queue"),
            batch_id=value("batch_id"),
            tag=value("tag"),
            parameter=parameter,
            limit=limit,
            offset=offset,
        )
    except ValueError as exc:
        raise BadRequest(str(exc), blamed_filter(str(exc))) from None
    page: dict[str, Any] = {"tasks": [task_to_json(info) for info in tasks]}
    if parameter is not None:  # whether a bounded search stopped early (Redis)
        page["cut_short"] = cut_short(tasks)
    return JsonResponse(page)


def blamed_filter(message: str) -> str | None:
    """The filter a ValueError of list_tasks is about: the one of LIST_FILTERS its message
    names first, as a word ("unknown status 'tag'" is about status), None when it names none."""
    named = [
        (found.start(), name)
        for name in LIST_FILTERS
        if (found := re.search(rf"\b{name}\b", message)) is not None
    ]
    return min(named)[1] if named else None


def query_parameter(request: HttpRequest) -> Any:
    """``?parameter=``: a JSON object of top-level keys and scalar values (None when absent),
    checked here as list_tasks checks it, so that any problem with it is a 400 naming
    ``parameter`` (a key named like another filter, "status", makes the message name it too)."""
    text = query_value(request, "parameter")
    if text is None:
        return None
    try:
        parameter = json.loads(text)
    except ValueError as exc:
        raise BadRequest(
            f'parameter must be a JSON object such as {{"customer_id": 42}}: {exc}', "parameter"
        ) from None
    except RecursionError:
        raise BadRequest(
            "parameter is not valid JSON: it is nested too deeply", "parameter"
        ) from None
    try:
        checked_parameter(parameter)
    except ValueError as exc:
        raise BadRequest(str(exc), "parameter") from None
    return parameter


def query_value(request: HttpRequest, name: str) -> str | None:
    """The query parameter ``name`` (None when absent); given twice is a 400."""
    values = request.GET.getlist(name)
    if len(values) > 1:
        raise BadRequest(f"{name} is given more than once", name)
    return values[0] if values else None


def query_int(request: HttpRequest, name: str, default: int, maximum: int | None) -> int:
    """The query parameter ``name`` as a whole number from 0 to ``maximum`` (None: no
    maximum), ``default`` when absent."""
    value = query_value(request, name)
    if value is None:
        return default
    if not value.isascii() or not value.isdigit():
        raise BadRequest(f"{name} must be a whole number >= 0, got {value[:100]!r}", name)
    digits = value.lstrip("0") or "0"
    # Compared by length first: int() refuses a text of more than 4300 digits (ValueError).
    if maximum is not None and (len(digits) > len(str(maximum)) or int(digits) > maximum):
        shown = digits if len(digits) <= 30 else f"a number of {len(digits)} digits"
        raise BadRequest(f"{name} must be at most {maximum}, got {shown}", name)
    return int(digits)


@api_view("GET", VIEW)
def detail(request: HttpRequest, task_id: str) -> HttpResponse:
    """GET one task: 200 with the task, 404 for an unknown id."""
    info = executor.get_task(task_id)
    if info is None:
        return error(404, f"no task {task_id!r}", "task_id")
    return JsonResponse(task_to_json(info))


def _shown(request: HttpRequest, info: TaskInfo | None) -> dict[str, Any] | None:
    """The task as an operate answer shows it: whole to a caller who may read tasks, else
    its id and status only (operating on a task is no permission to read it)."""
    if info is None:
        return None
    if may(request, VIEW):
        return task_to_json(info)
    return {"task_id": info.task_id, "status": info.status.value}


def _operate(
    request: HttpRequest, task_id: str, action: Callable[[str], bool], verb: str
) -> HttpResponse:
    """Run cancel/retry: 200 with the task, 404 unknown id, 409 when the status forbids it."""
    if executor.get_task(task_id) is None:
        return error(404, f"no task {task_id!r}", "task_id")
    changed = action(task_id)
    info = executor.get_task(task_id)
    task = _shown(request, info)
    if not changed:
        status = info.status.value if info is not None else "gone"
        return error(409, f"task {task_id!r} cannot be {verb} in status {status}", task=task)
    return JsonResponse({verb: True, "task": task})


@api_view("POST", OPERATE)
def cancel(request: HttpRequest, task_id: str) -> HttpResponse:
    """POST: cancel a waiting task, or ask a running one to stop (``cancel_requested``)."""
    return _operate(request, task_id, executor.cancel_task, "cancelled")


def parse_retry(request: HttpRequest) -> str | None:
    """The ``from_step`` of a retry's body: none, a JSON object with only that field, or a
    form with only that field; raises BadRequest."""
    if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded"):
        data: dict[str, Any] = dict(request.POST.items())
    elif not request.body.strip():
        return None
    else:
        data = json_object(request.body)
    unknown = sorted(set(data) - {"from_step"})
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}; a retry takes from_step", unknown[0])
    from_step = data.get("from_step")
    if from_step is None:
        return None
    try:
        return check_step_name(from_step, "from_step")
    except (TypeError, ValueError) as exc:
        raise BadRequest(str(exc), "from_step") from None


@api_view("POST", OPERATE)
def retry(request: HttpRequest, task_id: str) -> HttpResponse:
    """POST: run a FAILED/TIMEOUT/ERROR/CANCELLED task again, with a fresh retry budget. 409
    also while the handler of its timed-out attempt still runs, saying so. A body
    ``{"from_step": name}`` first discards the checkpoints of that durable step and the later
    ones (``retry_task(from_step=...)``): 409 naming the step when the task has no checkpoint
    of it (nothing changed), 400 for a body or name that cannot be one."""
    if executor.get_task(task_id) is None:
        return error(404, f"no task {task_id!r}", "task_id")
    try:
        from_step = parse_retry(request)
    except BadRequest as exc:
        return error(400, str(exc), exc.field)
    field: str | None = None
    try:
        reason = executor.retry_task_or_reason(task_id, from_step)
    except UnknownStepError as exc:
        reason, field = str(exc), "from_step"
    info = executor.get_task(task_id)
    task = _shown(request, info)
    if reason is not None:
        return error(409, f"task {task_id!r} not retried: {reason}", field, task=task)
    return JsonResponse({"retried": True, "task": task})
