"""On PostgreSQL, make the batch and rate-key indexes partial, as 0003 made the claim, lease,
deadline and finished ones: every state change of a task row (claim, start, finish) writes a
new entry into every index covering the new row version, and most tasks are in no batch and
never waiting with a rate limit.

- ``rexec_batch_idx`` (batch_id, status): only members of a batch (``batch_id = %s`` finds them).
- ``rexec_rate_key_idx`` (task_name, rate_key): only waiting tasks (``available``): the claims
  of a rate-limited name, and the admin's count of tasks held at their limit, read only those.

Other backends keep the plain indexes: MySQL has no partial indexes, and SQLite uses a partial
index only for a query whose condition is written as a literal, never for the bound parameters
Django sends.
"""

from django.db import migrations

TABLE = "reliable_executor_task"
PARTIAL = {
    "rexec_batch_idx": ("(batch_id, status)", "batch_id IS NOT NULL"),
    "rexec_rate_key_idx": ("(task_name, rate_key)", "available"),
}


def partial_on_postgres(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, (columns, condition) in PARTIAL.items():
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
        schema_editor.execute(f'CREATE INDEX "{name}" ON "{TABLE}" {columns} WHERE {condition}')


def plain_on_postgres(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, (columns, _) in PARTIAL.items():
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
        schema_editor.execute(f'CREATE INDEX "{name}" ON "{TABLE}" {columns}')


class Migration(migrations.Migration):
    dependencies = [("django_reliable_executor", "0021_batch_finished_index")]
    operations = [migrations.RunPython(partial_on_postgres, plain_on_postgres, elidable=False)]
