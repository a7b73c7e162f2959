"""App config: autodiscover every installed app's ``tasks`` module, register system checks and
the task gauges of the Prometheus registry."""

from __future__ import annotations

from django.apps import AppConfig
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

        autodiscover_modules("tasks")
        # Reads no storage now: the gauges ask the service when they are scraped.
        metrics.register_collectors()
