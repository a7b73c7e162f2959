"""Task tags (the submit option ``tags``): a task's ``tags`` (what its TaskInfo reads) and the
table indexing them, one row per task and tag, which ``list_tasks(tag=...)`` reads.

``tags`` is nullable, so adding it writes no row on PostgreSQL 11+ and MariaDB 10.3+. On
MySQL/MariaDB tags and task ids compare byte for byte, as on the other storages ("Import" and
"import" are two tags), and the task id matches the task table's (0002).
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_task_tag` "
        "MODIFY `tag` varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "MODIFY `task_id` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0034_finished_index_queue")]

    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="tags",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="ReliableTaskTag",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("tag", models.CharField(max_length=64)),
                ("task_id", models.CharField(max_length=191)),
            ],
            options={
                "db_table": "reliable_executor_task_tag",
                "default_permissions": (),
                "indexes": [models.Index(fields=["task_id"], name="rexec_tag_task_idx")],
                "constraints": [
                    models.UniqueConstraint(fields=("tag", "task_id"), name="rexec_tag_unique")
                ],
            },
        ),
        # Reversed by the table's removal.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
