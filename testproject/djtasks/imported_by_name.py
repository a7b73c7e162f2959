"""A Django task no test imports: only a worker meeting one of its stored tasks imports it."""

from django_reliable_executor.tasks_compat import task


@task()
def triple(value: int) -> int:
    return value * 3
