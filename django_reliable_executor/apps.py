"""App config: autodiscover every installed app's ``tasks`` module, register system checks and
the task gauges of the Prometheus registry."""

from __future__ import annotations

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules


class ReliableExecutorConfig(AppConfig):
    name = "django_reliable_executor"
    verbose_name = "Reliable executor"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401 - registers the system checks
            metrics,
        )

        if _uses_tasks_backend():
            # Before the tasks modules: their @task decorators register through it, and a
            # worker must be able to find a Django task it has no handler for yet.
            try:
                from . import tasks_backend  # noqa: F401
            except ImportError as exc:
                raise ImproperlyConfigured(
                    "TASKS uses django_reliable_executor's ReliableExecutorBackend, which needs "
                    "Django 6.0+ (django.tasks) or, on Django 5.2, the backport: pip install "
                    f"django-tasks ({exc})"
                ) from exc

        autodiscover_modules("tasks")
        # Reads no storage now: the gauges ask the service when they are scraped.
        metrics.register_collectors()


def _uses_tasks_backend() -> bool:
    """Whether a TASKS backend is ours (then django.tasks or the backport must be there)."""
    configured = getattr(settings, "TASKS", None) or {}
    return any(
        str(options.get("BACKEND", "")).startswith("django_reliable_executor.")
        for options in configured.values()
        if isinstance(options, dict)
    )
