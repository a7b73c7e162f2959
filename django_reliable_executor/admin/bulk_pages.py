"""The task admin's bulk actions: retry or cancel every task the list's filters match.

``bulk/?action=retry&<the list's filters>`` counts the matching tasks and asks to confirm
(view permission: anyone who sees the list sees the count); its POST starts the bulk action
(operate permission) through ``service.bulk_actions``, which a worker runs as a task of its
own. ``bulk/<task id>/`` shows how far it got, read from the storage (the page reloads itself
while it runs), with a button that stops it (operate permission)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from ..core.states import DEAD_LETTER_STATUSES, TaskStatus
from ..exceptions import StorageUnavailableError
from ..service.bulk_actions import (
    ACTIONS,
    COUNT_CAP,
    BulkStatus,
    bulk_status,
    count_up_to,
    start_bulk_action,
)
from . import task_pages
from .base import ServiceModelAdmin

TEMPLATE = "admin/django_reliable_executor/reliabletask/bulk_action.html"
VERBS = {"retry": ("Retry", "retried"), "cancel": ("Cancel", "cancelled")}
# Seconds between two reloads of a bulk action's page while it has not ended.
REFRESH_SECONDS = 2


def bulk_url(site_name: str, task_id: str | None = None) -> str:
    """The confirmation page (no ``task_id``) or a bulk action's page."""
    if task_id is None:
        return reverse(f"{site_name}:django_reliable_executor_reliabletask_bulk")
    return reverse(
        f"{site_name}:django_reliable_executor_reliabletask_bulk_status", args=[quote(task_id)]
    )


def filter_problem(query: QueryDict, filters: task_pages.Filters) -> str | None:
    """What the list's filters of ``query`` hold that ``Filters`` dropped (the list ignores a
    bad value; a bulk action over what is left would act on more tasks than meant)."""
    for name in task_pages.FILTERS:
        raw = query.get(name, "").strip()
        kept = filters.status_param if name == "status" else getattr(filters, name)
        if raw and kept is None:
            return f"unknown {name.replace('_', ' ')} {raw!r}"
    return None


def hidden_filters(filters: task_pages.Filters) -> list[tuple[str, str]]:
    """The list's filters as (name, value) pairs of a form's hidden fields."""
    query = QueryDict(filters.url(page=None)[1:])
    return [(name, query[name]) for name in task_pages.FILTERS if name in query]


def describe(filters: task_pages.Filters, since: dt.datetime | None) -> str:
    """The filters in words: "status=dead letters, task name=send_invoice, ..."."""
    parts = []
    for name in task_pages.FILTERS:
        value = filters.status_param if name == "status" else getattr(filters, name)
        if value is None:
            continue
        if name == "status" and value == task_pages.DEAD_LETTERS:
            value = "dead letters (FAILED, TIMEOUT, ERROR)"
        parts.append(f"{name.replace('_', ' ')}={value}")
    if since is not None:
        parts.append(f"submitted since {since:%Y-%m-%d %H:%M:%S} UTC")
    return ", ".join(parts) or "every task (no filter)"


def parse_time(text: str, name: str) -> dt.datetime | None:
    """An ISO date-time from a form, in UTC (taken as UTC when it names no offset);
    ValueError naming it."""
    text = text.strip()
    if not text:
        return None
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name}: not a date and time (YYYY-MM-DD HH:MM): {text!r}") from None
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    try:  # in UTC, as the pages show it (and its stored parameter)
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(f"{name}: out of range in UTC: {text!r}") from None


class BulkViews(ServiceModelAdmin):
    """Mixed into the task admin, which provides ``has_operate_permission`` and ``_context``."""

    #: The queue the bulk actions' tasks go to: a worker must serve it for them to run.
    bulk_action_queue = "default"
    #: The most tasks the confirmation page counts; past it, it says "at least" that many.
    bulk_count_cap = COUNT_CAP

    def has_operate_permission(self, request: HttpRequest) -> bool:
        raise NotImplementedError

    def _bulk_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("bulk/", wrap(self.bulk_view), name=f"{info}_bulk"),
            path("bulk/<path:task_id>/", wrap(self.bulk_status_view), name=f"{info}_bulk_status"),
        ]

    def bulk_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the count to confirm (view permission); POST: start it (operate)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        query = request.POST if request.method == "POST" else request.GET
        filters = task_pages.Filters.from_query(query)
        action = query.get("action", "")
        back = task_pages.changelist_url(self.admin_site.name) + filters.url()
        try:
            problem = filter_problem(query, filters)
            if action not in ACTIONS:
                problem = f"choose an action: {' or '.join(ACTIONS)}, not {action!r}"
            since = parse_time(query.get("since", ""), "submitted since")
            if problem is not None:
                raise ValueError(problem)
            if request.method == "POST":
                return self._start_bulk(request, action, filters, since)
            return self._confirm(request, action, filters, since)
        except ValueError as exc:
            messages.error(request, f"Nothing was started: {exc}.")
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, "Bulk action")
        return HttpResponseRedirect(back)

    def _confirm(
        self,
        request: HttpRequest,
        action: str,
        filters: task_pages.Filters,
        since: dt.datetime | None,
    ) -> HttpResponse:
        until = self.executor.clock.now()
        # Bounded: past the cap the page says "at least"; the walk goes on to the end.
        count = count_up_to(
            self.executor, filters.list_filters(), since, until, cap=self.bulk_count_cap
        )
        total = count.n
        verb, _ = VERBS[action]
        context = self._context(
            request,
            f"{verb} {count.words()} task{'s' if total != 1 else ''}?",
            confirm=True,
            action=action,
            verb=verb,
            total=total,
            complete=count.complete,
            description=describe(filters, since),
            hidden_filters=hidden_filters(filters),
            since=since,
            until=until.isoformat(),
            counted_at=until,
            list_url=task_pages.changelist_url(self.admin_site.name) + filters.url(),
            bulk_url=bulk_url(self.admin_site.name),
            queue=self.bulk_action_queue,
        )
        return TemplateResponse(request, TEMPLATE, context)

    def _start_bulk(
        self,
        request: HttpRequest,
        action: str,
        filters: task_pages.Filters,
        since: dt.datetime | None,
    ) -> HttpResponse:
        if not self.has_operate_permission(request):
            raise PermissionDenied
        until = parse_time(request.POST.get("until", ""), "counted at")
        if until is None:
            raise ValueError("the confirmation's time of count is missing")
        try:
            total = int(request.POST.get("total", ""))
        except ValueError:
            raise ValueError("the confirmation's total is not a number") from None
        task, created = start_bulk_action(
            self.executor,
            action,
            filters.list_filters(),
            total=total,
            until=until,
            since=since,
            queue=self.bulk_action_queue,
        )
        if created:
            messages.success(request, f"Bulk action started: {describe(filters, since)}.")
        else:
            messages.info(
                request,
                "This bulk action was started already (by this confirmation, or by another "
                "operator over the same filter): nothing was started twice.",
            )
        return HttpResponseRedirect(bulk_url(self.admin_site.name, task.task_id))

    def bulk_status_view(self, request: HttpRequest, task_id: str) -> HttpResponse:
        """A bulk action's progress (view permission); POST stops it (operate)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        task_id = unquote(task_id)
        here = bulk_url(self.admin_site.name, task_id)
        try:
            if request.method == "POST":
                return self._stop_bulk(request, task_id, here)
            status = bulk_status(self.executor, task_id)
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, "Bulk action")
        if status is None:
            messages.warning(request, f"No bulk action has the id {task_id!r}.")
            return HttpResponseRedirect(task_pages.changelist_url(self.admin_site.name))
        context = self._context(request, _title(status), **status_context(status, self))
        return TemplateResponse(request, TEMPLATE, context)

    def _stop_bulk(self, request: HttpRequest, task_id: str, here: str) -> HttpResponse:
        if not self.has_operate_permission(request):
            raise PermissionDenied
        if bulk_status(self.executor, task_id) is None:  # only a bulk action is stopped here
            messages.warning(request, f"No bulk action has the id {task_id!r}.")
        elif self.executor.cancel_task(task_id):
            messages.success(
                request, "Stop requested: the bulk action stops after its current chunk."
            )
        else:
            messages.warning(request, "The bulk action has ended already: nothing to stop.")
        return HttpResponseRedirect(here)


def _title(status: BulkStatus) -> str:
    verb, _ = VERBS[status.bulk.action]
    return f"{verb} {status.bulk.total:,} task{'s' if status.bulk.total != 1 else ''}"


def status_context(status: BulkStatus, admin: BulkViews) -> dict[str, Any]:
    """The template context of a bulk action's page."""
    task, bulk = status.task, status.bulk
    total = max(bulk.total, status.examined)
    site = admin.admin_site.name
    return {
        "bulk": bulk,
        "status": status,
        "task": task,
        "verb": VERBS[bulk.action][0],
        "done_verb": VERBS[bulk.action][1],
        "total": total,
        "percent": round(100 * status.examined / total) if total else 100,
        "description": _stored_description(bulk.filters, bulk.since),
        "ended": task.status.is_terminal,
        "completed": task.status is TaskStatus.COMPLETED,
        "refresh_seconds": None if task.status.is_terminal else REFRESH_SECONDS,
        "task_url": task_pages.change_url(task.task_id, site),
        "stop_url": bulk_url(site, task.task_id),
    }


def _stored_description(filters: dict[str, Any], since: dt.datetime | None) -> str:
    """A stored bulk action's filters (its list_tasks keywords) in the confirmation page's
    words (``describe``), so both pages name the same filter the same way."""
    parts = []
    for name, value in filters.items():
        if name == "statuses":
            if {TaskStatus(status) for status in value} == set(DEAD_LETTER_STATUSES):
                value = "dead letters (FAILED, TIMEOUT, ERROR)"
            else:
                value = ", ".join(value)
            name = "status"
        parts.append(f"{name.replace('_', ' ')}={value}")
    if since is not None:
        parts.append(f"submitted since {since:%Y-%m-%d %H:%M:%S} UTC")
    return ", ".join(parts) or "every task (no filter)"
