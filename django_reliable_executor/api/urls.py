"""URLs of the task, schedule and queue API; include under a prefix of your choice (docs/api.md)."""

from django.urls import path

from . import queue_views, schedule_views, views

app_name = "reliable_executor_api"

urlpatterns = [
    path("tasks/", views.submit, name="submit"),
    path("tasks/<path:task_id>/cancel/", views.cancel, name="cancel"),
    path("tasks/<path:task_id>/retry/", views.retry, name="retry"),
    path("tasks/<path:task_id>/", views.detail, name="detail"),
    path("queues/paused/", queue_views.paused, name="queues-paused"),
    path("queues/<path:queue>/pause/", queue_views.pause, name="queue-pause"),
    path("queues/<path:queue>/resume/", queue_views.resume, name="queue-resume"),
    path("schedules/", schedule_views.schedules, name="schedules"),
    path("schedules/<path:schedule_id>/pause/", schedule_views.pause, name="schedule-pause"),
    path("schedules/<path:schedule_id>/resume/", schedule_views.resume, name="schedule-resume"),
    path("schedules/<path:schedule_id>/delete/", schedule_views.delete, name="schedule-delete"),
    path("schedules/<path:schedule_id>/", schedule_views.detail, name="schedule-detail"),
]
