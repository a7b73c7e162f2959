"""max_concurrency: a lock row per capped task name, and an index counting a name's held tasks.

On PostgreSQL the held index is partial (as the indexes of 0003): only claimed, unfinished rows
are in it, so the rows waiting or finished cost it nothing. On MySQL/MariaDB the name column
compares byte for byte (as in 0002). SQLite and MySQL keep the plain composite index.
"""

from django.db import migrations, models

TABLE = "reliable_executor_task"
HELD_INDEX = "rexec_held_idx"


def postgres_partial(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{HELD_INDEX}"')
    schema_editor.execute(
        f'CREATE INDEX "{HELD_INDEX}" ON "{TABLE}" (task_name) '
        "WHERE NOT available AND status IN ('CREATED', 'PENDING', 'RUNNING')"
    )


def postgres_plain(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{HELD_INDEX}"')
    schema_editor.execute(
        f'CREATE INDEX "{HELD_INDEX}" ON "{TABLE}" (task_name, available, status)'
    )


def binary_name(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_name_lock` "
        "MODIFY `name` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0005_api_nonce")]

    operations = [
        migrations.CreateModel(
            name="ReliableNameLock",
            fields=[
                ("name", models.CharField(max_length=191, primary_key=True, serialize=False)),
            ],
            options={
                "db_table": "reliable_executor_name_lock",
                "default_permissions": (),
            },
        ),
        migrations.RunPython(binary_name, migrations.RunPython.noop, elidable=False),
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(fields=["task_name", "available", "status"], name="rexec_held_idx"),
        ),
        migrations.RunPython(postgres_partial, postgres_plain, elidable=False),
    ]
