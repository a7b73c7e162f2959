"""The tasks in Django's admin: a list with a summary, a detail page, retry and cancel.

``ReliableTask`` stays registered for its admin URLs and its permissions (which live in the auth
tables, whatever the storage), but every page reads and acts through the service, never the ORM:
the same pages work on the database and on Redis storage.

Permissions: viewing needs ``view_reliabletask``; retry and cancel need
``operate_reliabletask``. Nothing can be added, edited or deleted by hand.

The schedule pages (``ReliableScheduleAdmin``, for ``ReliableSchedule``) live in ``schedules``
and ``schedule_pages``, built the same way.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.views.generic import RedirectView

from ..exceptions import StorageUnavailableError
from ..models import ReliableTask
from ..service import ReliableExecutor, executor
from . import operations, pages

OPERATE_PERMISSION = "django_reliable_executor.operate_reliabletask"
TEMPLATES = "admin/django_reliable_executor/reliabletask/"
# At most this many ids per action request (a page shows PAGE_SIZE).
MAX_SELECTION = 1000


@admin.register(ReliableTask)
class ReliableTaskAdmin(admin.ModelAdmin):
    """Read-only task pages backed by the service, with retry and cancel for operators."""

    #: The service the pages use; a project may point a subclass at another instance.
    executor: ReliableExecutor = executor
    #: The summary's counts by queue and status, reused for a few seconds where counting is
    #: slow (a big task table); see pages.SlowCounts.
    counts_cache = pages.SlowCounts()

    # -- permissions ----------------------------------------------------------------------
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        opts = self.opts
        user: Any = request.user
        return bool(user.has_perm(f"{opts.app_label}.view_{opts.model_name}"))

    def has_operate_permission(self, request: HttpRequest) -> bool:
        """May retry and cancel tasks (``operate_reliabletask``)."""
        user: Any = request.user
        return bool(user.has_perm(OPERATE_PERMISSION))

    # -- URLs -----------------------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        info = (self.opts.app_label, self.opts.model_name)
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path(
                "<path:object_id>/change/",
                wrap(self.change_view),
                name="{}_{}_change".format(*info),
            ),
            # Like the admin's own: a task's bare URL leads to its page.
            path(
                "<path:object_id>/",
                wrap(
                    RedirectView.as_view(
                        pattern_name="{}:{}_{}_change".format(self.admin_site.name, *info)
                    )
                ),
            ),
        ]

    # -- pages ----------------------------------------------------------------------------
    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "has_view_permission": True,
            "can_operate": self.has_operate_permission(request),
            "changelist_url": pages.changelist_url(self.admin_site.name),
            **extra,
        }

    def _unavailable(self, request: HttpRequest, exc: Exception, title: str) -> HttpResponse:
        context = self._context(request, title, error=str(exc))
        return TemplateResponse(request, TEMPLATES + "unavailable.html", context, status=503)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
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
        if search:
            if self.executor.get_task(search) is not None:
                return HttpResponseRedirect(pages.change_url(search, self.admin_site.name))
            messages.warning(request, f"No task has the id {search!r}.")
        filters = pages.Filters.from_query(request.GET)
        by_queue, counts_age = self.counts_cache.get(self.executor)
        context = self._context(
            request,
            "Reliable tasks",
            filters=filters,
            search=search,
            task_names=sorted(pages.all_handlers()),
            filter_choices=pages.filter_choices(filters, by_queue),
            total=pages.matching_total(filters, by_queue),
            summary=pages.summary(self.executor, by_queue, counts_age),
            **pages.task_list(self.executor, filters, self.admin_site.name),
            **(extra_context or {}),
        )
        return TemplateResponse(request, TEMPLATES + "task_list.html", context)

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
            return self._act(request, [task_id], pages.change_url(task_id, self.admin_site.name))
        try:
            task = self.executor.get_task(task_id)
            if task is None:
                messages.warning(request, f"No task has the id {task_id!r}.")
                return HttpResponseRedirect(pages.changelist_url(self.admin_site.name))
            context = self._context(
                request,
                f"Task {task_id}",
                subtitle=task.task_name,
                **pages.task_detail(self.executor, task, self.admin_site.name),
                **(extra_context or {}),
            )
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, f"Task {task_id}")
        return TemplateResponse(request, TEMPLATES + "task_detail.html", context)

    # -- actions --------------------------------------------------------------------------
    def _act(self, request: HttpRequest, task_ids: list[str], back: str) -> HttpResponse:
        """Run the posted action (retry or cancel) on ``task_ids`` and go back with a message
        saying how many changed and why the others were skipped."""
        if not self.has_operate_permission(request):
            raise PermissionDenied
        action = operations.ACTIONS.get(request.POST.get("action", ""))
        if action is None:
            messages.error(request, "Choose an action: retry or cancel.")
        elif not task_ids:
            messages.warning(request, "Select the tasks to act on first: nothing was changed.")
        elif len(task_ids) > MAX_SELECTION:
            messages.error(request, f"At most {MAX_SELECTION} tasks at a time.")
        else:
            outcome = action(self.executor, task_ids)
            self.counts_cache.forget()
            messages.add_message(request, outcome.level, outcome.message())
        return HttpResponseRedirect(back)


# The schedule pages register ReliableSchedule's admin (imported last: it uses this package).
from . import schedules as schedules  # noqa: E402
from .schedules import ReliableScheduleAdmin as ReliableScheduleAdmin  # noqa: E402
