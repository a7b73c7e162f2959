"""URLs of the task, schedule and queue API; include under a prefix of your choice (docs/api.md)."""

from django.urls import path

from . import events, queues, schedules, tasks

app_name = "reliable_executor_api"

urlpatterns = [
    path("tasks/", tasks.submit, name="submit"),
    path("tasks/<path:task_id>/cancel/", tasks.cancel, name="cancel"),
    path("tasks/<path:task_id>/retry/", tasks.retry, name="retry"),
    path("tasks/<path:task_id>/events/<str:name>/", events.send, name="event"),
    path("tasks/<path:task_id>/", tasks.detail, name="detail"),
    path("queues/paused/", queues.paused, name="queues-paused"),
    path("queues/<path:queue>/pause/", queues.pause, name="queue-pause"),
    path("queues/<path:queue>/resume/", queues.resume, name="queue-resume"),
    path("schedules/", schedules.schedules, name="schedules"),
    path("schedules/<path:schedule_id>/pause/", schedules.pause, name="schedule-pause"),
    path("schedules/<path:schedule_id>/resume/", schedules.resume, name="schedule-resume"),
    path("schedules/<path:schedule_id>/delete/", schedules.delete, name="schedule-delete"),
    path("schedules/<path:schedule_id>/run/", schedules.run_now, name="schedule-run"),
    path("schedules/<path:schedule_id>/", schedules.detail, name="schedule-detail"),
]
