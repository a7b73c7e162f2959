"""A Django task outside any app's tasks module: a worker imports it by its path when it first
meets one of its tasks."""

from django_reliable_executor.tasks_compat import task


@task()
def found_by_path(value: int) -> int:
    return value * 2
