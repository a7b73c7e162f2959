"""The schedules in Django's admin: a list with active/paused counts, a detail page with the
next fire times, the last 24 hours and the last fires, pause, resume, run now and delete.

``ReliableSchedule`` is registered for its admin URLs and its permissions only: every page
reads and acts through the service (``list_schedules``, ``count_schedules``, ``get_schedule``,
``pause_schedule``, ``resume_schedule``, ``delete_schedule``), never the ORM, so the same
pages work on the database and on Redis storage (where the table stays empty).

Permissions: viewing (the rows' last-24-hours images too) needs ``view_reliableschedule``;
pause, resume and run now need ``change_reliableschedule``; delete needs
``delete_reliableschedule``. Nothing is added or
edited here: schedules are defined in code or through the HTTP API.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from ..exceptions import StorageUnavailableError
from ..models import ReliableSchedule
from . import schedule_pages
from .base import ServiceModelAdmin

TEMPLATES = "admin/django_reliable_executor/reliableschedule/"


@admin.register(ReliableSchedule)
class ReliableScheduleAdmin(ServiceModelAdmin):
    """Schedule pages backed by the service, with pause, resume and delete for operators."""

    noun = "schedule"

    # Django's own add and change forms are not offered (no ORM); pause/resume and delete
    # check the model's change and delete permissions through the methods below.
    def has_pause_permission(self, request: HttpRequest) -> bool:
        """May pause and resume schedules (``change_reliableschedule``)."""
        return self._has_perm(request, "change")

    def has_remove_permission(self, request: HttpRequest) -> bool:
        """May delete schedules (``delete_reliableschedule``)."""
        return self._has_perm(request, "delete")

    # -- URLs -----------------------------------------------------------------------------
    def get_urls(self) -> list[URLPattern]:
        info = (self.opts.app_label, self.opts.model_name)
        return self._service_urls(
            path(
                "<path:object_id>/delete/",
                self.admin_site.admin_view(self.delete_view),
                name="{}_{}_delete".format(*info),
            ),
            path(
                "<path:object_id>/activity.svg",
                self.admin_site.admin_view(self.activity_view),
                name="{}_{}_activity".format(*info),
            ),
        )

    # -- pages ----------------------------------------------------------------------------
    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return self._base_context(
            request,
            title,
            schedule_pages.changelist_url(self.admin_site.name),
            can_pause=self.has_pause_permission(request),
            can_delete=self.has_remove_permission(request),
            **extra,
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self._act(
                request, request.POST.getlist("_selected_action"), request.get_full_path()
            )
        filters = schedule_pages.Filters.from_query(request.GET)
        try:
            context = self._context(
                request,
                "Reliable schedules",
                filters=filters,
                summary=schedule_pages.summary(self.executor, filters),
                **schedule_pages.schedule_list(self.executor, filters, self.admin_site.name),
                **self.WIDE_PAGE,
                **(extra_context or {}),
            )
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, "Reliable schedules")
        return TemplateResponse(request, TEMPLATES + "schedule_list.html", context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        schedule_id = unquote(object_id)
        if request.method == "POST":
            back = schedule_pages.change_url(schedule_id, self.admin_site.name)
            return self._act(request, [schedule_id], back)
        try:
            schedule = self.executor.get_schedule(schedule_id)
            if schedule is None:
                return self._missing(request, schedule_id)
            context = self._context(
                request,
                f"Schedule {schedule_id}",
                subtitle=schedule.task_name,
                **schedule_pages.schedule_detail(self.executor, schedule, self.admin_site.name),
                **(extra_context or {}),
            )
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, f"Schedule {schedule_id}")
        return TemplateResponse(request, TEMPLATES + "schedule_detail.html", context)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """GET: a page asking to confirm; POST: delete the schedule (its tasks stay)."""
        if not self.has_view_permission(request) or not self.has_remove_permission(request):
            raise PermissionDenied
        schedule_id = unquote(object_id)
        title = f"Delete schedule {schedule_id}"
        try:
            if request.method == "POST":
                if self.executor.delete_schedule(schedule_id):
                    messages.success(
                        request,
                        f"Schedule {schedule_id!r} deleted; the tasks it fired stay.",
                    )
                    return HttpResponseRedirect(schedule_pages.changelist_url(self.admin_site.name))
                return self._missing(request, schedule_id)
            schedule = self.executor.get_schedule(schedule_id)
            if schedule is None:
                return self._missing(request, schedule_id)
            context = self._context(
                request,
                title,
                schedule=schedule,
                timing=schedule_pages.describe(schedule),
                detail_url=schedule_pages.change_url(schedule_id, self.admin_site.name),
                **(extra_context or {}),
            )
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, title)
        return TemplateResponse(request, TEMPLATES + "delete_confirmation.html", context)

    def activity_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """The list row's last 24 hours as an SVG image (404 for an unknown schedule, 503
        when the store cannot be reached): the list reads no run itself, the browser asks
        for each row's image as it shows it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            schedule = self.executor.get_schedule(unquote(object_id))
            if schedule is None:
                return HttpResponse(status=404)
            drawn = schedule_pages.list_activity(self.executor, schedule, self.executor.clock.now())
        except StorageUnavailableError:
            return HttpResponse(status=503)
        response = TemplateResponse(
            request,
            TEMPLATES + "activity.svg",
            {"activity": drawn},
            content_type="image/svg+xml; charset=utf-8",
        )
        response["Cache-Control"] = "private, max-age=60"
        return response

    def _missing(self, request: HttpRequest, schedule_id: str) -> HttpResponse:
        messages.warning(request, f"No schedule has the id {schedule_id!r}.")
        return HttpResponseRedirect(schedule_pages.changelist_url(self.admin_site.name))

    # -- actions --------------------------------------------------------------------------
    def _act(self, request: HttpRequest, schedule_ids: list[str], back: str) -> HttpResponse:
        allowed = self.has_pause_permission(request)
        return self._run_action(request, schedule_ids, back, schedule_pages.ACTIONS, allowed)
