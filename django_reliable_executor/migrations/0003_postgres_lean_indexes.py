"""On PostgreSQL, keep the task table's indexes lean: every state change of a row there writes a
new entry into every index that covers the new row version, so each entry saved is saved
three times per task (claim, start, finish).

- Drop the pattern-ops ("_like") index Django adds beside a varchar primary key: task ids are
  only ever matched exactly.
- Make the claim, lease, deadline and finished indexes partial: each serves only the rows its
  queries look for (waiting, claimed, timed, finished).

Other backends keep the plain indexes of 0001 (MySQL has no partial indexes).
"""

from django.db import migrations

TABLE = "reliable_executor_task"
PARTIAL = {
    "rexec_claim_idx": ("(available, queue, priority DESC, run_at)", "available"),
    "rexec_lease_idx": ("(lease_expires_at)", "lease_expires_at IS NOT NULL"),
    "rexec_deadline_idx": ("(deadline_at)", "deadline_at IS NOT NULL"),
    "rexec_finished_idx": ("(finished_at)", "finished_at IS NOT NULL"),
}


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = %s "
            "AND indexname LIKE 'reliable_executor_task_task_id_%%_like'",
            [TABLE],
        )
        for (name,) in cursor.fetchall():
            schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
    for name, (columns, condition) in PARTIAL.items():
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
        schema_editor.execute(f'CREATE INDEX "{name}" ON "{TABLE}" {columns} WHERE {condition}')


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, (columns, _) in PARTIAL.items():
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')
        schema_editor.execute(f'CREATE INDEX "{name}" ON "{TABLE}" {columns}')


class Migration(migrations.Migration):
    dependencies = [("django_reliable_executor", "0002_mysql_binary_ids")]
    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
