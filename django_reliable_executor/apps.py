"""App config: autodiscover every installed app's ``tasks`` module, register system checks,
connect the service to the modules below it and register the task gauges of the Prometheus
registry."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import autodiscover_modules

from . import (
    checks,  # noqa: F401 - registers the system checks
    registry,
)
from .conf import SETTING_NAME
from .observability import metrics
from .service.reliable_executor import executor


class ReliableExecutorConfig(AppConfig):
    name = "django_reliable_executor"
    verbose_name = "Reliable executor"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The modules below the service never import it: it is connected to them here.
        registry.connect_submitter(executor.submit)
        setting_changed.connect(_reset_executor, dispatch_uid="django_reliable_executor.reset")

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
        metrics.register_collectors(executor)


def _reset_executor(*, setting: str, **kwargs: Any) -> None:
    """Build the service's storage again from overridden settings (tests)."""
    if setting == SETTING_NAME:
        executor.reset()


def _uses_tasks_backend() -> bool:
    """Whether a TASKS backend is ours (then django.tasks or the backport must be there)."""
    configured = getattr(settings, "TASKS", None) or {}
    return any(
        str(options.get("BACKEND", "")).startswith("django_reliable_executor.")
        for options in configured.values()
        if isinstance(options, dict)
    )
