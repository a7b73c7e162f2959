"""The admin's throughput chart: automatic retries per UTC minute (a table of one row a minute),
and the status beside finished_at in the finished index, so that the chart's count of the last
hour's endings by status (and the purge) reads the index alone.

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
        f'CREATE INDEX "{FINISHED_INDEX}" ON "{TABLE}" (finished_at, status) '
        "WHERE finished_at IS NOT NULL"
    )


def plain_on_postgres(apps, schema_editor):
    """Back to the index AddIndex made, which its own reversal drops."""
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{FINISHED_INDEX}"')
    schema_editor.execute(f'CREATE INDEX "{FINISHED_INDEX}" ON "{TABLE}" (finished_at, status)')


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0016_rate_key_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReliableRetryCount",
            fields=[
                ("minute", models.BigIntegerField(primary_key=True, serialize=False)),
                ("retried", models.BigIntegerField(default=0)),
            ],
            options={
                "db_table": "reliable_executor_retry_count",
                "default_permissions": (),
            },
        ),
        migrations.RemoveIndex(model_name="reliabletask", name=FINISHED_INDEX),
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(fields=["finished_at", "status"], name=FINISHED_INDEX),
        ),
        migrations.RunPython(partial_on_postgres, plain_on_postgres, elidable=False),
    ]
