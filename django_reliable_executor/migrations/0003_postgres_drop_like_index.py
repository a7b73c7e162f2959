"""On PostgreSQL, drop the pattern-ops index Django adds beside a varchar primary key.

Task ids are only ever matched exactly, never with LIKE, and on PostgreSQL every state change
rewrites every index entry of the row: one index fewer is one write fewer per transition.
"""

from django.db import migrations


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'reliable_executor_task' "
            "AND indexname LIKE 'reliable_executor_task_task_id_%%_like'"
        )
        names = [row[0] for row in cursor.fetchall()]
    for name in names:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):
    dependencies = [("django_reliable_executor", "0002_mysql_binary_ids")]
    operations = [migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False)]
