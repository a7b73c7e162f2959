"""Schedules per vendor: on MySQL/MariaDB the schedule id, task name and last task id compare
byte for byte (as task ids do, 0002); on PostgreSQL the due index is partial, holding only the
active schedules.
"""

from django.db import migrations

ID_COLUMNS = [
    ("schedule_id", "varchar(191)", "NOT NULL"),
    ("task_name", "varchar(191)", "NOT NULL"),
    ("last_task_id", "varchar(191)", "NULL"),
]


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        changes = ", ".join(
            f"MODIFY `{name}` {kind} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin {null}"
            for name, kind, null in ID_COLUMNS
        )
        schema_editor.execute(f"ALTER TABLE `reliable_executor_schedule` {changes}")
    elif vendor == "postgresql":
        schema_editor.execute('DROP INDEX IF EXISTS "rexec_sched_due_idx"')
        schema_editor.execute(
            'CREATE INDEX "rexec_sched_due_idx" ON "reliable_executor_schedule" '
            "(paused, next_run_at) WHERE NOT paused"
        )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute('DROP INDEX IF EXISTS "rexec_sched_due_idx"')
        schema_editor.execute(
            'CREATE INDEX "rexec_sched_due_idx" ON "reliable_executor_schedule" '
            "(paused, next_run_at)"
        )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0007_schedules")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
