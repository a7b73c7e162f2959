"""A Django task outside every installed app: a worker must never import it because a stored
task names it (tests/integration/tasks_backend/test_tasks_backend.py checks it stays out of
sys.modules)."""

from django_reliable_executor.tasks_compat import task

IMPORTED = True  # a side effect of importing this module at all


@task()
def squat(value: int) -> int:
    return value
