"""Batches: the batch table (counters, callbacks) and the task's batch_id. On MySQL/MariaDB
the ids compare byte for byte, as task ids do (see 0002)."""

from django.db import migrations, models


def binary_ids(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_batch` MODIFY `batch_id` varchar(191) "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_task` MODIFY `batch_id` varchar(191) "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [
        ("django_reliable_executor", "0018_task_trace_context"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReliableBatch",
            fields=[
                ("batch_id", models.CharField(max_length=191, primary_key=True, serialize=False)),
                ("total", models.PositiveIntegerField(default=0, help_text="Members stored.")),
                ("completed", models.PositiveIntegerField(default=0)),
                (
                    "failed",
                    models.PositiveIntegerField(default=0, help_text="FAILED, TIMEOUT and ERROR."),
                ),
                ("cancelled", models.PositiveIntegerField(default=0)),
                ("sealed", models.BooleanField(default=False)),
                ("callbacks", models.JSONField(default=dict)),
                ("created_at", models.DateTimeField()),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "reliable batch",
                "verbose_name_plural": "reliable batches",
                "db_table": "reliable_executor_batch",
            },
        ),
        migrations.AddField(
            model_name="reliabletask",
            name="batch_id",
            field=models.CharField(blank=True, max_length=191, null=True),
        ),
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(fields=["batch_id", "status"], name="rexec_batch_idx"),
        ),
        migrations.AddIndex(
            model_name="reliablebatch",
            index=models.Index(fields=["created_at"], name="rexec_batch_created_idx"),
        ),
        migrations.RunPython(binary_ids, migrations.RunPython.noop, elidable=False),
    ]
