"""What the task and schedule admins share: pages through the service, never the ORM."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import django
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.views.generic import RedirectView

from ..service.reliable_executor import ReliableExecutor, executor

UNAVAILABLE_TEMPLATE = "admin/django_reliable_executor/unavailable.html"
# At most this many ids per action request (a page shows PAGE_SIZE).
MAX_SELECTION = 1000


class ServiceModelAdmin(admin.ModelAdmin):
    """A model registered for its admin URLs and permissions only: every page reads and acts
    through ``executor``, so the same pages work on the database and on Redis storage.
    Nothing is added or edited through Django's own forms."""

    #: The service the pages use; a project may point a subclass at another instance.
    executor: ReliableExecutor = executor
    #: "task" or "schedule": what the pages show, in messages and the 503 page.
    noun = ""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _has_perm(self, request: HttpRequest, action: str) -> bool:
        user: Any = request.user
        return bool(user.has_perm(f"{self.opts.app_label}.{action}_{self.opts.model_name}"))

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._has_perm(request, "view")

    def _service_urls(self, *extra: URLPattern) -> list[URLPattern]:
        """The list, each object's page, ``extra`` ones, and (like the admin's own) an
        object's bare URL leading to its page."""
        info = (self.opts.app_label, self.opts.model_name)
        wrap = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path(
                "<path:object_id>/change/",
                wrap(self.change_view),
                name="{}_{}_change".format(*info),
            ),
            *extra,
            path(
                "<path:object_id>/",
                wrap(
                    RedirectView.as_view(
                        pattern_name="{}:{}_{}_change".format(self.admin_site.name, *info)
                    )
                ),
            ),
        ]

    # The list pages leave out the admin's app sidebar (on the other pages it stays): beside it
    # a 1280 px window left the task table 631 px, its columns behind a sideways scroll, and
    # the counts by queue ran past the page's edge. Breadcrumbs still lead back.
    WIDE_PAGE: dict[str, Any] = {"is_nav_sidebar_enabled": False}

    def _base_context(
        self, request: HttpRequest, title: str, changelist_url: str, **extra: Any
    ) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "has_view_permission": True,
            "changelist_url": changelist_url,
            # Django 6's change list puts the filter inside .changelist-form-container, beside a
            # <div> holding the rest (its CSS lays them out there); 5.2's, after that container.
            "filter_inside": django.VERSION >= (6, 0),
            **extra,
        }

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _unavailable(self, request: HttpRequest, exc: Exception, title: str) -> HttpResponse:
        """503: the store cannot be reached (the admin's own pages still work)."""
        context = self._context(request, title, error=str(exc), noun=self.noun)
        return TemplateResponse(request, UNAVAILABLE_TEMPLATE, context, status=503)

    def _run_action(
        self,
        request: HttpRequest,
        ids: list[str],
        back: str,
        actions: Mapping[str, Callable[[ReliableExecutor, list[str]], Any]],
        allowed: bool,
    ) -> HttpResponse:
        """Run the posted action on ``ids`` and go back with a message saying how many
        changed and why the others were skipped."""
        if not allowed:
            raise PermissionDenied
        action = actions.get(request.POST.get("action", ""))
        if action is None:
            messages.error(request, f"Choose an action: {' or '.join(actions)}.")
        elif not ids:
            messages.warning(
                request, f"Select the {self.noun}s to act on first: nothing was changed."
            )
        elif len(ids) > MAX_SELECTION:
            messages.error(request, f"At most {MAX_SELECTION} {self.noun}s at a time.")
        else:
            outcome = action(self.executor, ids)
            self._acted()
            messages.add_message(request, outcome.level, outcome.message())
        return HttpResponseRedirect(back)

    def _acted(self) -> None:  # noqa: B027 - optional hook
        """Called after an action changed something (the task admin forgets its counts)."""
