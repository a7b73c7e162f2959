"""Runs skipped by a schedule's overlap policy, counted per schedule and UTC hour for the
schedule pages' last 24 hours (kept a day).

On MySQL/MariaDB the schedule id compares byte for byte, as the schedule table's (0008).
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_schedule_skip` "
        "MODIFY `schedule_id` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0037_stack_requests")]

    operations = [
        migrations.CreateModel(
            name="ReliableScheduleSkip",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("schedule_id", models.CharField(max_length=191)),
                ("hour", models.BigIntegerField(help_text="Hours since the epoch (UTC).")),
                ("skipped", models.BigIntegerField(default=0)),
            ],
            options={
                "db_table": "reliable_executor_schedule_skip",
                "default_permissions": (),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("schedule_id", "hour"), name="rexec_sched_skip_uniq"
                    )
                ],
                "indexes": [models.Index(fields=["hour"], name="rexec_sched_skip_hour_idx")],
            },
        ),
        # Reversed by the table's removal.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
