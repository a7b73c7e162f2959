"""The parameter index of the database storage (setting SEARCHABLE_PARAMETERS): one row per task
and searchable top-level key, holding the value's canonical JSON text, which
``list_tasks(parameter=...)`` reads through the unique index (key, value, task_id).

An empty table: tasks stored before a key was made searchable get their rows from
``python manage.py executor index-parameters``. On MySQL/MariaDB keys and values compare byte
for byte, trailing spaces included (a NO PAD binary collation, as 0032's keys: "A", "a" and
"A " are three values), and the task id matches the task table's (0002).
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_task_param` "
        f"MODIFY `key` varchar(100) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
        f"MODIFY `value` varchar(200) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
        "MODIFY `task_id` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0038_schedule_skips")]

    operations = [
        migrations.CreateModel(
            name="ReliableTaskParameter",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=100)),
                ("value", models.CharField(max_length=200)),
                ("task_id", models.CharField(max_length=191)),
            ],
            options={
                "db_table": "reliable_executor_task_param",
                "default_permissions": (),
                "indexes": [models.Index(fields=["task_id"], name="rexec_param_task_idx")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("key", "value", "task_id"), name="rexec_param_unique"
                    )
                ],
            },
        ),
        # Reversed by the table's removal.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
