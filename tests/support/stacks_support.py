"""What the live stack tests share: the endpoint's URL and a handler seen asleep on a worker."""

from __future__ import annotations

from django.contrib.admin.utils import quote
from django.urls import reverse

from django_reliable_executor.core.states import TaskStatus
from tests.support.processes import Backend, executions, wait_until

# demo.record's sleep: long enough for the asking, short enough to end the test soon after.
SLEEP = 4.0


def stack_url(task_id: str) -> str:
    """The task admin's live stack endpoint (admin/stack_pages.py) for ``task_id``."""
    return reverse("admin:django_reliable_executor_reliabletask_stack", args=[quote(task_id)])


def running_record(service, backend: Backend, workers, **options) -> str:
    """A demo.record task submitted and seen asleep in its handler (its Execution row
    written just before ``time.sleep``): its id."""
    info = service.submit("demo.record", {"sleep": SLEEP}, **options)
    wait_until(
        lambda: executions(backend, info.task_id).exists(),
        15,
        "the handler did not start",
        logs=workers.logs,
    )
    assert service.get_task(info.task_id).status is TaskStatus.RUNNING
    return info.task_id
