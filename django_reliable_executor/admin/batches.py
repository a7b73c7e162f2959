"""The task admin's batch page: its URL, the view (view permission) and the bulk retry of its
failed members (operate permission); what the page shows is built in batch_pages."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from ..core.batches import BatchInfo
from ..exceptions import StorageUnavailableError
from . import batch_pages, task_pages
from .base import ServiceModelAdmin

TEMPLATE = "admin/django_reliable_executor/reliabletask/batch_detail.html"


class BatchViews(ServiceModelAdmin):
    """Mixed into the task admin, which provides ``has_operate_permission`` and ``_context``."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        raise NotImplementedError

    def _batch_url(self) -> URLPattern:
        return path(
            "batch/<path:batch_id>/",
            self.admin_site.admin_view(self.batch_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_batch",
        )

    def batch_view(self, request: HttpRequest, batch_id: str) -> HttpResponse:
        """A batch's page (view permission); POST retries its failed members (operate)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        batch_id = unquote(batch_id)
        site = self.admin_site.name
        try:
            batch = self.executor.get_batch(batch_id)
            if batch is None:
                messages.warning(request, f"No batch has the id {batch_id!r}.")
                return HttpResponseRedirect(task_pages.changelist_url(site))
            if request.method == "POST":
                return self._retry_batch(request, batch)
            context = self._context(
                request,
                f"Batch {batch_id}",
                **batch_pages.batch_detail(self.executor, batch, site),
            )
        except StorageUnavailableError as exc:
            return self._unavailable(request, exc, f"Batch {batch_id}")
        return TemplateResponse(request, TEMPLATE, context)

    def _retry_batch(self, request: HttpRequest, batch: BatchInfo) -> HttpResponse:
        if not self.has_operate_permission(request):
            raise PermissionDenied
        back = task_pages.batch_url(batch.batch_id, self.admin_site.name)
        if request.POST.get("action") != "retry_failed":
            messages.error(request, "Choose an action: retry_failed.")
            return HttpResponseRedirect(back)
        outcome = batch_pages.retry_failed_members(self.executor, batch)
        self._acted()
        text = outcome.message()
        if not outcome.changed and not outcome.skipped:
            text = "No failed member to retry."
        elif batch.finished:
            text += " The batch stays finished: its callbacks do not run again."
        messages.add_message(request, outcome.level, text)
        return HttpResponseRedirect(back)
