"""The task column limited_name, second in the claim index: the waiting tasks of a name with a
rate_limit or a max_concurrency (claimed one name at a time) sit in a range of the index of
their own, so the claim of all other names never reads past a name's backlog held at its
limit, and each name's claim reads only its own tasks.

On PostgreSQL the claim index stays partial, as 0003 made it: only waiting rows are in it.
Existing waiting tasks start with limited_name "": the master's chores set it on those of
limited names from the first round of a worker of this version, 500 tasks a round.

MariaDB and PostgreSQL add the column without rewriting the table; the claim index is built
again (on a large waiting backlog, that takes a while: run it before a quiet hour).
"""

from django.db import migrations, models

TABLE = "reliable_executor_task"
CLAIM_INDEX = "rexec_claim_idx"
# The columns of the partial claim index on PostgreSQL, before (0003) and after this migration.
OLD_COLUMNS = "(available, queue, priority DESC, run_at)"
NEW_COLUMNS = "(limited_name, queue, priority DESC, run_at)"


def _partial(schema_editor, columns):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{CLAIM_INDEX}"')
    schema_editor.execute(f'CREATE INDEX "{CLAIM_INDEX}" ON "{TABLE}" {columns} WHERE available')


def new_partial(apps, schema_editor):
    _partial(schema_editor, NEW_COLUMNS)


def old_partial(apps, schema_editor):
    _partial(schema_editor, OLD_COLUMNS)


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0023_postgres_lean_batch_rate_key")]

    operations = [
        # Reversed last: the plain index that RemoveIndex's reversal makes, partial again.
        migrations.RunPython(migrations.RunPython.noop, old_partial, elidable=False),
        migrations.RemoveIndex(model_name="reliabletask", name=CLAIM_INDEX),
        migrations.AddField(
            model_name="reliabletask",
            name="limited_name",
            field=models.CharField(blank=True, db_default="", default="", max_length=191),
        ),
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(
                fields=["available", "limited_name", "queue", "-priority", "run_at"],
                name=CLAIM_INDEX,
            ),
        ),
        migrations.RunPython(new_partial, migrations.RunPython.noop, elidable=False),
    ]
