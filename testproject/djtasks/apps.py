import logging
from typing import Any

from django.apps import AppConfig

# Under the app's logger, which the test project's LOGGING prints (the worker logs at INFO):
# the process tests read these lines in the worker's log.
logger = logging.getLogger("django_reliable_executor.djtasks")


def log_signal(signal_name: str):
    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        logger.info(
            "djtasks signal=%s id=%s path=%s status=%s attempts=%s sender=%s",
            signal_name,
            task_result.id,
            task_result.task.module_path,
            task_result.status,
            task_result.attempts,
            sender.__name__,
        )

    return receiver


class DjtasksConfig(AppConfig):
    name = "djtasks"

    def ready(self) -> None:
        """Django's task_started and task_finished are sent in the worker that runs the task."""
        from django_reliable_executor.tasks_compat import task_finished, task_started

        task_started.connect(log_signal("task_started"), weak=False, dispatch_uid="djtasks-s")
        task_finished.connect(log_signal("task_finished"), weak=False, dispatch_uid="djtasks-f")
