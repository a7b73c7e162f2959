"""The admin summary's sparklines: the queue beside finished_at and status in the finished
index, so that the count of the last hour's completions by queue and minute reads the index
alone, as the throughput chart's count by status does (0017). No table and no write more per
ending: the queue of a task never changes, and its finish already writes this index.

On PostgreSQL the finished index stays partial (only finished rows, as 0003 made it). Rebuilding
it reads the task table once: on a big table, run this migration at a quiet time.
"""

from django.db import migrations, models

TABLE = "reliable_executor_task"
FINISHED_INDEX = "rexec_finished_idx"


def partial_on_postgres(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{FINISHED_INDEX}"')
    schema_editor.execute(
        f'CREATE INDEX "{FINISHED_INDEX}" ON "{TABLE}" (finished_at, status, queue) '
        "WHERE finished_at IS NOT NULL"
    )


def plain_on_postgres(apps, schema_editor):
    """Back to the index AddIndex made, which its own reversal drops."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{FINISHED_INDEX}"')
    schema_editor.execute(
        f'CREATE INDEX "{FINISHED_INDEX}" ON "{TABLE}" (finished_at, status, queue)'
    )


def partial_again_on_postgres(apps, schema_editor):
    """Reversed: the (finished_at, status) index 0017 left, partial again."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{FINISHED_INDEX}"')
    schema_editor.execute(
        f'CREATE INDEX "{FINISHED_INDEX}" ON "{TABLE}" (finished_at, status) '
        "WHERE finished_at IS NOT NULL"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0033_fair_rounds_per_queue"),
    ]

    operations = [
        # Reversed, RemoveIndex recreates the plain (finished_at, status) index: made partial
        # again by the first RunPython's reversal, which runs after it.
        migrations.RunPython(migrations.RunPython.noop, partial_again_on_postgres, elidable=False),
        migrations.RemoveIndex(model_name="reliabletask", name=FINISHED_INDEX),
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(fields=["finished_at", "status", "queue"], name=FINISHED_INDEX),
        ),
        migrations.RunPython(partial_on_postgres, plain_on_postgres, elidable=False),
    ]
