"""On MySQL/MariaDB, compare task ids, names and queues byte for byte, as every other backend does.

A server's default collation (often utf8mb4_general_ci) would make "order-A" and "order-a" one
task id; the binary collation keeps ids exact. Other backends are left as they are.
"""

from django.db import migrations

COLUMNS = {
    "reliable_executor_task": [
        ("task_id", "varchar(191)", "NOT NULL"),
        ("task_name", "varchar(191)", "NOT NULL"),
        ("queue", "varchar(100)", "NOT NULL"),
        ("worker_id", "varchar(191)", "NULL"),
    ],
    "reliable_executor_lock": [("name", "varchar(100)", "NOT NULL")],
    "reliable_executor_worker": [("worker_id", "varchar(191)", "NOT NULL")],
}


def _alter(apps, schema_editor, collation):
    # Going back keeps the binary collation: ids that differ only in case may exist by then.
    if schema_editor.connection.vendor != "mysql":
        return
    for table, columns in COLUMNS.items():
        changes = ", ".join(
            f"MODIFY `{name}` {kind} CHARACTER SET utf8mb4 COLLATE {collation} {null}"
            for name, kind, null in columns
        )
        schema_editor.execute(f"ALTER TABLE `{table}` {changes}")


def forwards(apps, schema_editor):
    _alter(apps, schema_editor, "utf8mb4_bin")


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0001_initial")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
