"""URLs of the task API; include under a prefix of your choice (see docs/api.md)."""

from django.urls import path

from . import views

app_name = "reliable_executor_api"

urlpatterns = [
    path("tasks/", views.submit, name="submit"),
    path("tasks/<path:task_id>/cancel/", views.cancel, name="cancel"),
    path("tasks/<path:task_id>/retry/", views.retry, name="retry"),
    path("tasks/<path:task_id>/", views.detail, name="detail"),
]
