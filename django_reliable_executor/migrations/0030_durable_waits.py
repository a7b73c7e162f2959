"""Durable waits (``context.sleep``, ``wait_for_event``, ``wait_for``): a task's ``waiting`` and
``resumptions``, and the table of the events sent to tasks, one row per (task, event name).

``waiting`` is nullable and ``resumptions`` has a default in the database, so adding them
writes no row on PostgreSQL 11+ and MariaDB 10.3+ (an instant ADD COLUMN). On MySQL/MariaDB the
event table's task id and name compare byte for byte, as the step table's (0029).
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_task_event` "
        "MODIFY `task_id` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "MODIFY `name` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0029_task_steps")]

    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="waiting",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="reliabletask",
            name="resumptions",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.CreateModel(
            name="ReliableTaskEvent",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task_id", models.CharField(max_length=191)),
                ("name", models.CharField(max_length=191)),
                ("payload", models.JSONField(blank=True, null=True)),
                ("sent_at", models.DateTimeField()),
            ],
            options={
                "db_table": "reliable_executor_task_event",
                "default_permissions": (),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("task_id", "name"), name="rexec_event_unique"
                    )
                ],
            },
        ),
        # Reversed by the table's deletion.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
