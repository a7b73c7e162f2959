"""The tasks in Django's admin: a list with a summary, a detail page, retry and cancel, pausing
and resuming queues.

``ReliableTask`` stays registered for its admin URLs and its permissions (which live in the auth
tables, whatever the storage), but every page reads and acts through the service, never the ORM:
the same pages work on the database and on Redis storage.

Permissions: viewing needs ``view_reliabletask``; retry (of a task, or of one from a durable
step of its timeline), cancel, pause and resume need ``operate_reliabletask``. Nothing can be
added, edited or deleted by hand.

What the pages show is built in ``task_pages`` (the list and a task's page) and
``task_summary`` (the list's summary). A batch's page and the bulk retry of its failed members
live in ``batches`` and ``batch_pages``. The schedule pages (``ReliableScheduleAdmin``, for
``ReliableSchedule``) live in ``schedules`` and ``schedule_pages``, built the same way.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern

from ..exceptions import StorageUnavailableError
from ..models import ReliableTask
from . import operations, parameter_search, task_detail, task_pages, task_summary
from .base import ServiceModelAdmin
from .batches import BatchViews
from .bulk_pages import BulkViews
from .graph_views import GraphViews
from .health import DueThresholds
from .stack_pages import StackViews

OPERATE_PERMISSION = "django_reliable_executor.operate_reliabletask"
TEMPLATES = "admin/django_reliable_executor/reliabletask/"


@admin.register(ReliableTask)
class ReliableTaskAdmin(StackViews, GraphViews, BulkViews, BatchViews, ServiceModelAdmin):
    """Read-only task pages backed by the service, with retry and cancel for operators."""

    noun = "task"
    #: The summary's counts by queue and status, reused for a few seconds where counting is
    #: slow (a big task table); see task_summary.SlowCounts.
    counts_cache = task_summary.SlowCounts()
    #: When the summary's oldest due task ages turn amber and red (seconds waited); see
    #: docs/admin.md. Subclass and set another ``health.DueThresholds`` to change them.
    due_thresholds = DueThresholds()

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """May retry and cancel tasks, pause and resume queues (``operate_reliabletask``)."""
        user: Any = request.user
        return bool(user.has_perm(OPERATE_PERMISSION))

    def get_urls(self) -> list[URLPattern]:
        # First: "batch/<id>/" must not be read as the bare URL of a task whose id is "batch/...".
        # So must "stack/<id>/" (the live stack's endpoint, stack_pages.py).
        # And "bulk/..." (the bulk actions, bulk_pages.py).
        return [
            self._batch_url(),
            self._stack_url(),
            *self._bulk_urls(),
            *self._service_urls(self._graph_url()),
        ]

    # -- pages ----------------------------------------------------------------------------
    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return self._base_context(
            request,
            title,
            task_pages.changelist_url(self.admin_site.name),
            can_operate=self.has_operate_permission(request),
            **extra,
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            if "queue_action" in request.POST:
                return self._change_queue(request)
            return self._act(
                request, request.POST.getlist("_selected_action"), request.get_full_path()
            )
        try:
            return self._changelist(request, extra_context)
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, "Reliable tasks")

    def _changelist(
        self, request: HttpRequest, extra_context: dict[str, Any] | None
    ) -> HttpResponse:
        search = request.GET.get("q", "").strip()
        filters = task_pages.Filters.from_query(request.GET)
        found = self._searched(request, search, filters)
        if found is not None:
            return found
        _, problem = parameter_search.url_parameter(request.GET.get("parameter"))
        if problem is not None:
            messages.error(request, problem)
        by_queue, counts_age = self.counts_cache.get(self.executor)
        context = self._context(
            request,
            "Reliable tasks",
            filters=filters,
            search=search or parameter_search.filters_text(filters.tag, filters.parameter),
            task_names=sorted(task_pages.all_handlers()),
            filter_choices=task_pages.filter_choices(filters, by_queue),
            total=task_pages.matching_total(filters, by_queue),
            summary=task_summary.summary(self.executor, by_queue, counts_age, self.due_thresholds),
            **task_pages.task_list(self.executor, filters, self.admin_site.name),
            **self.WIDE_PAGE,
            **(extra_context or {}),
        )
        return TemplateResponse(request, TEMPLATES + "task_list.html", context)

    def _searched(
        self, request: HttpRequest, search: str, filters: task_pages.Filters
    ) -> HttpResponse | None:
        """The answer to a search box text: the task of that id, or the list filtered by its
        terms ("tag:import customer_id=42", the other filters kept); None: the list itself
        (no search, or one not understood: a message says why)."""
        if not search:
            return None
        single = not parameter_search.is_filter_search(search) or len(search.split()) == 1
        if single and not search.startswith(parameter_search.TAG_PREFIX):
            # An exact task id first (an id may hold "="), then key=value.
            if self.executor.get_task(search) is not None:
                return HttpResponseRedirect(task_pages.change_url(search, self.admin_site.name))
            if not parameter_search.is_filter_search(search):
                messages.warning(request, f"No task has the id {search!r}.")
                return None
        terms = parameter_search.parse(search)
        if terms.problem is not None:
            messages.error(request, terms.problem)
            return None
        url = filters.url(tag=terms.tag, parameter=terms.parameter_text)
        return HttpResponseRedirect(request.path + url)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        task_id = unquote(object_id)
        if request.method == "POST":
            back = task_pages.change_url(task_id, self.admin_site.name)
            if request.POST.get("action") == "retry_from_step":
                return self._retry_from_step(request, task_id, back)
            if request.POST.get("action") == "send_event":
                return self._send_event(request, task_id, back)
            return self._act(request, [task_id], back)
        try:
            task = self.executor.get_task(task_id)
            if task is None:
                messages.warning(request, f"No task has the id {task_id!r}.")
                return HttpResponseRedirect(task_pages.changelist_url(self.admin_site.name))
            context = self._context(
                request,
                f"Task {task_id}",
                subtitle=task.task_name,
                **task_detail.task_detail(self.executor, task, self.admin_site.name),
                **self.graph_context(task),
                **(extra_context or {}),
            )
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, f"Task {task_id}")
        return TemplateResponse(request, TEMPLATES + "task_detail.html", context)

    # -- actions --------------------------------------------------------------------------
    def _act(self, request: HttpRequest, task_ids: list[str], back: str) -> HttpResponse:
        allowed = self.has_operate_permission(request)
        return self._run_action(request, task_ids, back, operations.ACTIONS, allowed)

    def _retry_from_step(self, request: HttpRequest, task_id: str, back: str) -> HttpResponse:
        """A step's "Retry from this step" button on the task's page."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        step = request.POST.get("step", "")
        outcome = operations.retry_from_step(self.executor, task_id, step)
        if outcome.changed:
            self._acted()
        messages.add_message(request, outcome.level, outcome.message())
        return HttpResponseRedirect(back)

    def _send_event(self, request: HttpRequest, task_id: str, back: str) -> HttpResponse:
        """The "Send event" form of the task's page (``executor.send_event``)."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        level, message = operations.send_event(
            self.executor,
            task_id,
            request.POST.get("event", ""),
            request.POST.get("payload", ""),
        )
        if level == messages.SUCCESS:
            self._acted()
        messages.add_message(request, level, message)
        return HttpResponseRedirect(back)

    def _change_queue(self, request: HttpRequest) -> HttpResponse:
        """The summary's pause/resume button of one queue."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        level, text = operations.change_queue(
            self.executor, request.POST["queue_action"], request.POST.get("queue", "")
        )
        messages.add_message(request, level, text)
        self._acted()
        return HttpResponseRedirect(request.get_full_path())

    def _acted(self) -> None:
        self.counts_cache.forget()
