"""The task page's workflow graph: its context, the fragment URL the page reloads it from while
the workflow runs (view permission), and retry or cancel of one of its tasks (operate
permission, the admin's own retry and cancel); what is drawn is built in workflow_graph,
graph_layout and graph_svg."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..core.records import TaskInfo
from ..exceptions import StorageUnavailableError
from . import operations, task_pages
from .base import ServiceModelAdmin
from .graph_svg import drawing
from .workflow_graph import read_graph

FRAGMENT = "admin/django_reliable_executor/reliabletask/workflow_graph_body.html"
#: Seconds between two reloads of a graph whose tasks have not all ended.
REFRESH_SECONDS = 3


class GraphViews(ServiceModelAdmin):
    """Mixed into the task admin, which provides ``has_operate_permission``."""

    def has_operate_permission(self, request: HttpRequest) -> bool:
        raise NotImplementedError

    def _graph_url(self) -> URLPattern:
        return path(
            "<path:object_id>/graph/",
            self.admin_site.admin_view(self.graph_view),
            name=f"{self.opts.app_label}_{self.opts.model_name}_graph",
        )

    def graph_context(self, task: TaskInfo) -> dict[str, Any]:
        """The task page's part: ``graph`` (None when the task stands alone)."""
        graph = read_graph(self.executor, task, self.admin_site.name)
        if not graph.worth_drawing:
            return {"graph": None}
        url = reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_graph",
            args=[quote(task.task_id)],
        )
        return {"graph": {**drawing(graph), "url": url, "refresh_seconds": REFRESH_SECONDS}}

    def graph_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the graph's fragment (what the page reloads); POST: retry or cancel the task
        ``task_id`` of the form, then back to the page's graph."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        task_id = unquote(object_id)
        if request.method == "POST":
            if not self.has_operate_permission(request):
                raise PermissionDenied
            back = task_pages.change_url(task_id, self.admin_site.name) + "#re-graph"
            self._act_on_node(request, request.POST.get("task_id", "").strip())
            return HttpResponseRedirect(back)
        try:
            task = self.executor.get_task(task_id)
            if task is None:
                raise Http404(f"No task has the id {task_id!r}.")
            context = self.graph_context(task)
        except StorageUnavailableError as exc:
            return HttpResponse(str(exc), status=503, content_type="text/plain")
        context["can_operate"] = self.has_operate_permission(request)
        return TemplateResponse(request, FRAGMENT, context)

    def _act_on_node(self, request: HttpRequest, chosen: str) -> None:
        """Retry or cancel the task ``chosen`` (a node of the graph), and say which task it
        was (a link to its page) and what became of it, or why nothing did."""
        action = operations.ACTIONS.get(request.POST.get("action", ""))
        if action is None:
            messages.error(request, "Choose an action: retry or cancel.")
            return
        if not chosen:
            messages.warning(request, "Choose a task of the graph first: nothing was changed.")
            return
        outcome = action(self.executor, [chosen])
        if outcome.changed or outcome.requested:
            self._acted()
        url = task_pages.change_url(chosen, self.admin_site.name)
        messages.add_message(request, outcome.level, node_message(outcome, chosen, url))


def node_message(outcome: operations.Outcome, task_id: str, url: str) -> SafeString:
    """What became of one task of the graph: "Task <id> retried.", "... cancel requested ...",
    or "Task <id> not retried: <why>." (the id a link to its page)."""
    if outcome.changed:
        return format_html('Task <a href="{}">{}</a> {}.', url, task_id, outcome.verb)
    if outcome.requested:
        return format_html(
            'Task <a href="{}">{}</a>: cancel requested (it is RUNNING: it ends when its '
            "attempt does).",
            url,
            task_id,
        )
    why = outcome.error or ", ".join(outcome.skipped) or "nothing changed"
    return format_html('Task <a href="{}">{}</a> not {}: {}.', url, task_id, outcome.verb, why)
