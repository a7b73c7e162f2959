"""rate_limit: the task's rate key, and the sliding log of claims (moved to their starts) per
rate-limited name.

On MySQL/MariaDB the name and key columns compare byte for byte (as in 0002 and 0006): keys that
differ only in case are different limits.
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    for table, column, null in (
        ("reliable_executor_task", "rate_key", "NULL"),
        ("reliable_executor_rate_log", "name", "NOT NULL"),
        ("reliable_executor_rate_log", "rate_key", "NOT NULL"),
        ("reliable_executor_rate_log", "task_id", "NOT NULL"),
    ):
        schema_editor.execute(
            f"ALTER TABLE `{table}` MODIFY `{column}` varchar(191) "
            f"CHARACTER SET utf8mb4 COLLATE utf8mb4_bin {null}"
        )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0012_schedule_overlap")]

    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="rate_key",
            field=models.CharField(blank=True, max_length=191, null=True),
        ),
        migrations.CreateModel(
            name="ReliableRateLog",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=191)),
                ("rate_key", models.CharField(default="", max_length=191)),
                ("task_id", models.CharField(max_length=191)),
                ("token", models.BigIntegerField()),
                ("claimed_at", models.DateTimeField()),
            ],
            options={
                "db_table": "reliable_executor_rate_log",
                "default_permissions": (),
                "indexes": [
                    models.Index(fields=["name", "claimed_at"], name="rexec_rate_log_idx"),
                    models.Index(fields=["task_id"], name="rexec_rate_log_task_idx"),
                ],
            },
        ),
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
