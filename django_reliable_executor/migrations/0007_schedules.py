"""Schedules: one row per periodic schedule, found by the master through (paused, next_run_at).

0008 tunes it per vendor.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0006_max_concurrency"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReliableSchedule",
            fields=[
                (
                    "schedule_id",
                    models.CharField(max_length=191, primary_key=True, serialize=False),
                ),
                ("task_name", models.CharField(max_length=191)),
                ("parameter", models.JSONField(blank=True, null=True)),
                (
                    "every_micros",
                    models.BigIntegerField(blank=True, help_text="Interval schedules.", null=True),
                ),
                ("cron", models.CharField(blank=True, max_length=200, null=True)),
                ("timezone", models.CharField(default="UTC", max_length=64)),
                ("start_at", models.DateTimeField()),
                ("misfire", models.CharField(default="skip", max_length=16)),
                ("queue", models.CharField(default="default", max_length=100)),
                ("priority", models.IntegerField(default=0)),
                ("retry_limit", models.PositiveIntegerField(default=3)),
                ("retry_interval", models.BigIntegerField(default=2000, help_text="Milliseconds.")),
                ("retry_backoff", models.CharField(default="fixed", max_length=16)),
                ("max_duration_millis", models.BigIntegerField(blank=True, null=True)),
                ("paused", models.BooleanField(default=False)),
                ("next_run_at", models.DateTimeField()),
                ("last_run_at", models.DateTimeField(blank=True, null=True)),
                ("last_task_id", models.CharField(blank=True, max_length=191, null=True)),
                ("origin", models.CharField(default="api", max_length=16)),
                ("created_at", models.DateTimeField()),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "reliable schedule",
                "db_table": "reliable_executor_schedule",
                "ordering": ["schedule_id"],
                "indexes": [
                    models.Index(fields=["paused", "next_run_at"], name="rexec_sched_due_idx")
                ],
            },
        ),
    ]
