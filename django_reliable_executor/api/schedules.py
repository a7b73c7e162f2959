"""JSON views of periodic schedules: define, list, get, pause, resume, run now and delete,
through the service's schedule methods, with the task views' authentication and error answers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from ..core.numbers import is_int, is_number
from ..exceptions import InvalidScheduleError, TaskSubmitError, UnknownScheduleError
from ..schedules.records import ScheduleInfo
from ..service.listing import MAX_OFFSET
from ..service.reliable_executor import executor
from .auth import may
from .tasks import (
    BadRequest,
    api_methods,
    aware_datetime,
    error,
    json_object,
    query_int,
    query_value,
)

PERMISSION = "django_reliable_executor.{}_reliableschedule"
VIEW = PERMISSION.format("view")
ADD = PERMISSION.format("add")
CHANGE = PERMISSION.format("change")
DELETE = PERMISSION.format("delete")
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000

# The fields of a definition and the JSON types each takes ("null" too, except the required).
_STRING = (str,)
_INTEGER = (int,)
_NUMBER = (int, float)
DEFINE_FIELDS: dict[str, tuple[type, ...] | None] = {
    "schedule_id": _STRING,
    "task_name": _STRING,
    "parameter": None,  # any JSON value
    "every": _NUMBER,
    "cron": _STRING,
    "timezone": _STRING,
    "queue": _STRING,
    "priority": _INTEGER,
    "start_at": _STRING,
    "misfire": _STRING,
    "overlap": _STRING,
    "retry_limit": _INTEGER,
    "retry_interval": _INTEGER,
    "retry_backoff": _STRING,
    "max_duration_millis": _INTEGER,
}
REQUIRED = ("schedule_id", "task_name")
_TYPE_NAMES = {_STRING: "a string", _INTEGER: "an integer", _NUMBER: "a number"}
# JSON's true and false are no numbers here (Python's bool is an int).
_TYPE_TESTS: dict[tuple[type, ...], Callable[[Any], bool]] = {
    _STRING: lambda value: isinstance(value, str),
    _INTEGER: is_int,
    _NUMBER: is_number,
}
_JSON_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def schedule_json(info: ScheduleInfo) -> dict[str, Any]:
    """A ScheduleInfo as JSON: ``every`` in seconds, datetimes in ISO 8601 (UTC), and the
    timing described for people."""
    every: float | int | None = None
    if info.every is not None:
        seconds = info.every.total_seconds()
        every = int(seconds) if seconds.is_integer() else seconds

    def when(value: dt.datetime | None) -> str | None:
        return value.astimezone(dt.timezone.utc).isoformat() if value is not None else None

    return {
        "schedule_id": info.schedule_id,
        "task_name": info.task_name,
        "parameter": info.parameter,
        "every": every,
        "cron": info.cron,
        "timezone": info.timezone,
        "start_at": when(info.start_at),
        "misfire": info.misfire,
        "overlap": info.overlap,
        "queue": info.queue,
        "priority": info.priority,
        "retry_limit": info.retry_limit,
        "retry_interval": info.retry_interval,
        "retry_backoff": info.retry_backoff,
        "max_duration_millis": info.max_duration_millis,
        "paused": info.paused,
        "next_run_at": when(info.next_run_at),
        "last_run_at": when(info.last_run_at),
        "last_task_id": info.last_task_id,
        "overlap_skipped": info.overlap_skipped,
        "last_skipped_at": when(info.last_skipped_at),
        "origin": info.origin,
        "created_at": when(info.created_at),
        "updated_at": when(info.updated_at),
        "description": info.describe(),
    }


def parse_definition(body: bytes) -> dict[str, Any]:
    """The keyword arguments of ``executor.schedule`` from a JSON object body; checks the
    JSON types only (the service checks the values). Raises BadRequest."""
    data = json_object(body)
    unknown = sorted(set(data) - set(DEFINE_FIELDS))
    if unknown:
        raise BadRequest(f"unknown field {unknown[0]!r}", unknown[0])
    for name in REQUIRED:
        if data.get(name) is None:
            raise BadRequest(f"{name} is required", name)
    for name, types in DEFINE_FIELDS.items():
        value = data.get(name)
        if types is None or value is None:
            continue
        if not _TYPE_TESTS[types](value):
            got = _JSON_NAMES.get(type(value), type(value).__name__)
            raise BadRequest(f"{name} must be {_TYPE_NAMES[types]} or null, got {got}", name)
    if data.get("start_at") is not None:
        data["start_at"] = aware_datetime(data["start_at"], "start_at")
    for name in ("misfire", "overlap"):
        if data.get(name) is None:
            data.pop(name, None)  # the service's default
    return data


def _list(request: HttpRequest) -> HttpResponse:
    unknown = sorted(set(request.GET) - {"limit", "offset", "paused"})
    if unknown:
        raise BadRequest(f"unknown query parameter {unknown[0]!r}", unknown[0])
    limit = query_int(request, "limit", DEFAULT_LIMIT, MAX_LIMIT)
    offset = query_int(request, "offset", 0, MAX_OFFSET)
    paused_text = query_value(request, "paused")
    paused: bool | None = None
    if paused_text is not None:
        if paused_text not in ("true", "false"):
            raise BadRequest(f"paused must be true or false, got {paused_text!r}", "paused")
        paused = paused_text == "true"
    schedules = executor.list_schedules(limit=limit, offset=offset, paused=paused)
    return JsonResponse(
        {
            "schedules": [schedule_json(info) for info in schedules],
            "counts": executor.count_schedules(),
        }
    )


def _define(request: HttpRequest) -> HttpResponse:
    options = parse_definition(request.body)
    schedule_id = options.pop("schedule_id")
    task_name = options.pop("task_name")
    existed = executor.get_schedule(schedule_id) is not None
    try:
        info = executor.schedule(schedule_id, task_name, **options)
    except (InvalidScheduleError, TaskSubmitError) as exc:
        raise BadRequest(str(exc), exc.field) from None
    return JsonResponse(schedule_json(info), status=200 if existed else 201)


@api_methods({"GET": VIEW, "POST": ADD})
def schedules(request: HttpRequest) -> HttpResponse:
    """GET: list schedules (``limit``, ``offset``, ``paused``) with the counts. POST: create
    (201) or redefine (200) one schedule from a JSON definition."""
    try:
        return _list(request) if request.method == "GET" else _define(request)
    except BadRequest as exc:
        return error(400, str(exc), exc.field)


def _unknown(schedule_id: str) -> HttpResponse:
    return error(404, f"no schedule {schedule_id!r}", "schedule_id")


def _delete(schedule_id: str) -> HttpResponse:
    if not executor.delete_schedule(schedule_id):
        return _unknown(schedule_id)
    return JsonResponse({"deleted": True, "schedule_id": schedule_id})


@api_methods({"GET": VIEW, "DELETE": DELETE})
def detail(request: HttpRequest, schedule_id: str) -> HttpResponse:
    """GET: one schedule. DELETE: forget it (the tasks it fired stay). 404 for an unknown id."""
    if request.method == "DELETE":
        return _delete(schedule_id)
    info = executor.get_schedule(schedule_id)
    if info is None:
        return _unknown(schedule_id)
    return JsonResponse(schedule_json(info))


@api_methods({"POST": DELETE})
def delete(request: HttpRequest, schedule_id: str) -> HttpResponse:
    """POST: as DELETE on the schedule, for clients that cannot send DELETE."""
    return _delete(schedule_id)


def _changed(request: HttpRequest, schedule_id: str, info: ScheduleInfo | None) -> HttpResponse:
    """The answer of pause and resume: the schedule whole to a caller who may read schedules,
    else only its id and whether it is paused (changing one is no permission to read it)."""
    if info is None:
        return _unknown(schedule_id)
    if may(request, VIEW):
        return JsonResponse(schedule_json(info))
    return JsonResponse({"schedule_id": info.schedule_id, "paused": info.paused})


@api_methods({"POST": CHANGE})
def pause(request: HttpRequest, schedule_id: str) -> HttpResponse:
    """POST: stop firing; 200 with the schedule (also when it was paused already)."""
    return _changed(request, schedule_id, executor.pause_schedule(schedule_id))


@api_methods({"POST": CHANGE})
def resume(request: HttpRequest, schedule_id: str) -> HttpResponse:
    """POST: fire again (missed runs meet the misfire policy); 200 with the schedule."""
    return _changed(request, schedule_id, executor.resume_schedule(schedule_id))


@api_methods({"POST": CHANGE})
def run_now(request: HttpRequest, schedule_id: str) -> HttpResponse:
    """POST: fire one run of the schedule now (``executor.run_schedule_now``); 200 with its
    ``task_id``, the same while that run is not finished (a repeated call fires nothing
    more). The planned runs are left as they are. 404 for an unknown id."""
    try:
        task_id = executor.run_schedule_now(schedule_id)
    except UnknownScheduleError:
        return _unknown(schedule_id)
    return JsonResponse({"schedule_id": schedule_id, "task_id": task_id})
