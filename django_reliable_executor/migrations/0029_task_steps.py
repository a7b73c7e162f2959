"""Durable steps (``context.step``): the table of the tasks' checkpoints, one row per (task, step
name), unique on the pair.

A new table, so nothing is rewritten on any vendor: the cost is one CREATE TABLE and its unique
index. On MySQL/MariaDB the task id and the step name compare byte for byte (as in 0002 and
0013): ids and names that differ only in case are different, as on every other backend.
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_task_step` "
        "MODIFY `task_id` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "MODIFY `name` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0028_task_attempt_timeout")]

    operations = [
        migrations.CreateModel(
            name="ReliableTaskStep",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("task_id", models.CharField(max_length=191)),
                ("name", models.CharField(max_length=191)),
                ("result", models.JSONField(blank=True, null=True)),
                ("finished_at", models.DateTimeField()),
                ("token", models.BigIntegerField()),
            ],
            options={
                "db_table": "reliable_executor_task_step",
                "default_permissions": (),
                "constraints": [
                    models.UniqueConstraint(
                        fields=("task_id", "name"), name="rexec_step_unique"
                    )
                ],
            },
        ),
        # Reversed by the table's deletion.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
