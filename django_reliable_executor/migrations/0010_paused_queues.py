"""Paused queues: one row per queue that claims leave alone (executor.pause_queue). On
MySQL/MariaDB the queue is compared byte for byte, like the task table's queue column (0002):
pausing "Mail" must not pause "mail"."""

from django.db import migrations, models


def binary_queue(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_paused_queue` "
        "MODIFY `queue` varchar(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [
        ("django_reliable_executor", "0009_worker_queues_text"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReliablePausedQueue",
            fields=[
                ("queue", models.CharField(max_length=100, primary_key=True, serialize=False)),
                ("paused_at", models.DateTimeField()),
            ],
            options={
                "db_table": "reliable_executor_paused_queue",
                "default_permissions": (),
            },
        ),
        migrations.RunPython(binary_queue, migrations.RunPython.noop, elidable=False),
    ]
