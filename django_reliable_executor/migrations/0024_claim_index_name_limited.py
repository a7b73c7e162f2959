"""The task column name_limited, second in the claim index: the waiting tasks of names with a
rate_limit or a max_concurrency (claimed one name at a time) sit apart in the index from the
rest, so the claim of all other names never reads past a name's backlog held at its limit.

On PostgreSQL the claim index stays partial, as 0003 made it: only waiting rows are in it.
Existing waiting tasks start with name_limited false; the master's chores set it on those of
limited names within a minute of the first worker of this version starting.

MariaDB and PostgreSQL add the column without rewriting the table; the claim index is built
again (on a large waiting backlog, that takes a while: run it before a quiet hour).
"""

from django.db import migrations, models

TABLE = "reliable_executor_task"
CLAIM_INDEX = "rexec_claim_idx"
# The columns of the partial claim index on PostgreSQL, before (0003) and after this migration.
OLD_COLUMNS = "(available, queue, priority DESC, run_at)"
NEW_COLUMNS = "(name_limited, queue, priority DESC, run_at)"


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
            name="name_limited",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(
                fields=["available", "name_limited", "queue", "-priority", "run_at"],
                name=CLAIM_INDEX,
            ),
        ),
        migrations.RunPython(new_partial, migrations.RunPython.noop, elidable=False),
    ]
