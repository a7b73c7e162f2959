"""Round-robin fairness (``fairness="round_robin"``): a task's ``flow_round``, in the claim index
after the priority, and the table of each fair name's keys with their next round.

``flow_round`` is 0 for every task of a name without fairness, so their pickup order stays
(priority, then run at). Adding the column with a default writes no row on PostgreSQL 11+ and
MariaDB 10.3+; the claim index is built again (on a large waiting backlog that takes a while:
run it before a quiet hour). On PostgreSQL the claim index stays partial (0003, 0024): only
waiting rows are in it. On MySQL/MariaDB the keys compare byte for byte, trailing spaces
included (a NO PAD binary collation).
"""

from django.db import migrations, models

TABLE = "reliable_executor_task"
CLAIM_INDEX = "rexec_claim_idx"
# The columns of the partial claim index on PostgreSQL, before (0024) and after this migration.
OLD_COLUMNS = "(limited_name, queue, priority DESC, run_at)"
NEW_COLUMNS = "(limited_name, queue, priority DESC, flow_round, run_at)"


def _partial(schema_editor, columns):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f'DROP INDEX IF EXISTS "{CLAIM_INDEX}"')
    schema_editor.execute(f'CREATE INDEX "{CLAIM_INDEX}" ON "{TABLE}" {columns} WHERE available')


def new_partial(apps, schema_editor):
    _partial(schema_editor, NEW_COLUMNS)


def old_partial(apps, schema_editor):
    _partial(schema_editor, OLD_COLUMNS)


def binary_columns(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    # NO PAD: "A" and "A " are two keys (utf8mb4_bin compares them equal on MariaDB, which
    # would give two keys one row); MySQL 8's utf8mb4_0900_bin is NO PAD already.
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_fair_key` "
        f"MODIFY `name` varchar(191) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL, "
        f"MODIFY `key` varchar(191) CHARACTER SET utf8mb4 COLLATE {collation} NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0031_concurrency_keys")]

    operations = [
        # Reversed last: the plain index that RemoveIndex's reversal makes, partial again.
        migrations.RunPython(migrations.RunPython.noop, old_partial, elidable=False),
        migrations.RemoveIndex(model_name="reliabletask", name=CLAIM_INDEX),
        migrations.AddField(
            model_name="reliabletask",
            name="flow_round",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(
                fields=["available", "limited_name", "queue", "-priority", "flow_round", "run_at"],
                name=CLAIM_INDEX,
            ),
        ),
        migrations.RunPython(new_partial, migrations.RunPython.noop, elidable=False),
        migrations.CreateModel(
            name="ReliableFairKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=191)),
                ("key", models.CharField(max_length=191)),
                ("next_round", models.BigIntegerField()),
            ],
            options={
                "db_table": "reliable_executor_fair_key",
                "default_permissions": (),
                "constraints": [
                    models.UniqueConstraint(fields=("name", "key"), name="rexec_fair_key_uniq")
                ],
            },
        ),
        # Reversed by the table's removal.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
