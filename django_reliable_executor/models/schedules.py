"""Tables of schedules: the schedules and their overlap skips per hour."""

from __future__ import annotations

from django.db import models

from ..core.ids import MAX_ID_LENGTH


class ReliableSchedule(models.Model):
    """A periodic schedule (database storage): its definition, and when it fires next."""

    schedule_id = models.CharField(max_length=MAX_ID_LENGTH, primary_key=True)
    task_name = models.CharField(max_length=MAX_ID_LENGTH)
    parameter = models.JSONField(null=True, blank=True)
    every_micros = models.BigIntegerField(null=True, blank=True, help_text="Interval schedules.")
    cron = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - None: interval
    timezone = models.CharField(max_length=64, default="UTC")
    start_at = models.DateTimeField()
    misfire = models.CharField(max_length=16, default="skip")
    queue = models.CharField(max_length=100, default="default")
    priority = models.IntegerField(default=0)
    retry_limit = models.PositiveIntegerField(default=3)
    retry_interval = models.BigIntegerField(default=2000, help_text="Milliseconds.")
    retry_backoff = models.CharField(max_length=16, default="fixed")
    max_duration_millis = models.BigIntegerField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    next_run_at = models.DateTimeField()
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_task_id = models.CharField(max_length=MAX_ID_LENGTH, null=True, blank=True)  # noqa: DJ001
    origin = models.CharField(max_length=16, default="api")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    # "skip": a run due while the previous run (last_task_id) is not terminal is not fired.
    overlap = models.CharField(max_length=8, default="allow")
    overlap_skipped = models.BigIntegerField(default=0, help_text="Runs skipped for overlap.")
    last_skipped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "reliable_executor_schedule"
        verbose_name = "reliable schedule"
        ordering = ["schedule_id"]
        # view: see schedules; change: pause and resume; add: create through the HTTP API;
        # delete: in the admin and the HTTP API.
        indexes = [
            # The master's "due now" query: active schedules by next run.
            models.Index(fields=["paused", "next_run_at"], name="rexec_sched_due_idx"),
        ]

    def __str__(self) -> str:
        return self.schedule_id


class ReliableScheduleSkip(models.Model):
    """Runs of one schedule skipped by its overlap policy in one UTC hour, for the schedule
    pages' last 24 hours (storage/database/schedule_skips.py): one upsert per round that
    skips, rows older than a day deleted with the next one, so the table stays small."""

    id = models.BigAutoField(primary_key=True)
    schedule_id = models.CharField(max_length=MAX_ID_LENGTH)
    hour = models.BigIntegerField(help_text="Hours since the epoch (UTC).")
    skipped = models.BigIntegerField(default=0)

    class Meta:
        db_table = "reliable_executor_schedule_skip"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["schedule_id", "hour"], name="rexec_sched_skip_uniq")
        ]
        indexes = [models.Index(fields=["hour"], name="rexec_sched_skip_hour_idx")]

    def __str__(self) -> str:
        return f"{self.schedule_id} hour {self.hour}: {self.skipped} skipped"
