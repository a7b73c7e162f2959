"""On PostgreSQL, the index of ``list_tasks(parameter=...)``: a GIN index (jsonb_path_ops) of the
task parameters that are JSON objects, which ``parameter @> '{"customer_id": 42}'`` reads.

jsonb_path_ops keeps one hash per path to a value, smaller and faster for ``@>`` than the
default jsonb_ops (which also answers key-exists queries, never asked here). Partial: tasks
whose parameter is not an object (none, a list, a number) add no entry, and the searches say
``jsonb_typeof(parameter) = 'object'`` so that the planner may use it. Built CONCURRENTLY, so
that submitting and claiming go on while it is built on a large table (hence not atomic).

MariaDB/MySQL and SQLite get no index: neither can index the values of arbitrary JSON keys
(a generated column indexes one named key), so they check the rows other filters lead to
(storage/database/parameter_search.py; docs/benchmarks.md has the cost).
"""

from django.db import migrations

TABLE = "reliable_executor_task"
INDEX = "rexec_parameter_gin"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{INDEX}" ON "{TABLE}" '
        "USING gin (parameter jsonb_path_ops) WHERE jsonb_typeof(parameter) = 'object'"
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{INDEX}"')


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0035_task_tags")]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
