"""Live stacks of running tasks (executor.request_stack): the table of requests and answers.

On MySQL/MariaDB the task and worker ids compare byte for byte, as on the other storages, and
match the task table's (0002).
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_stack_request` "
        "MODIFY `task_id` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "MODIFY `worker_id` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0036_task_parameter_index")]

    operations = [
        migrations.CreateModel(
            name="ReliableStackRequest",
            fields=[
                (
                    "request_id",
                    models.CharField(max_length=32, primary_key=True, serialize=False),
                ),
                ("task_id", models.CharField(max_length=191)),
                ("worker_id", models.CharField(max_length=191)),
                ("requested_at", models.DateTimeField()),
                ("answered_at", models.DateTimeField(blank=True, null=True)),
                ("answer", models.TextField(blank=True, null=True)),
            ],
            options={
                "db_table": "reliable_executor_stack_request",
                "default_permissions": (),
                "indexes": [
                    models.Index(
                        fields=["worker_id", "requested_at"], name="rexec_stack_worker_idx"
                    ),
                    models.Index(fields=["requested_at"], name="rexec_stack_requested_idx"),
                ],
            },
        ),
        # Reversed by the table's removal.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
