"""A read-only admin list of tasks (database storage)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from .models import ReliableTask


@admin.register(ReliableTask)
class ReliableTaskAdmin(admin.ModelAdmin):
    list_display = (
        "task_id",
        "task_name",
        "status",
        "queue",
        "priority",
        "attempts",
        "created_at",
        "run_at",
        "finished_at",
    )
    list_filter = ("status", "queue", "task_name")
    search_fields = ("=task_id",)
    ordering = ("-created_at",)
    show_full_result_count = False  # no full-table COUNT on large tables
    readonly_fields = [f.name for f in ReliableTask._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
