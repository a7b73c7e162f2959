"""Round-robin fairness: a key's next round kept per (name, queue, priority, key), as the round
the claims are at is per queue and priority (a key that submitted at another priority or queue
found its next task far behind the backlog).

Each (name, key) row becomes that key's row in every queue and priority where the name has
unfinished tasks (read through the index on task names), with the same next round: never
lower than before, so no waiting task loses its place; the chores delete the rows of keys with
nothing waiting there. On MySQL/MariaDB ``name`` and ``key`` keep their NO PAD binary
collation (0032): these operations leave those columns as they are; ``queue`` is byte for
byte too (``utf8mb4_bin``, as the tasks' queue column).
"""

from django.db import migrations, models

UNFINISHED = ["CREATED", "PENDING", "RUNNING"]


def binary_queue(apps, schema_editor):
    """On MySQL/MariaDB the queue compared byte for byte, as every other queue column (0010):
    with the table's default collation "Mail" and "mail" shared their keys' rows."""
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_fair_key` "
        "MODIFY `queue` varchar(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


def spread_rows(apps, schema_editor):
    """Each old row copied to every (queue, priority) of its name's unfinished tasks (it was
    given ("default", 0) by AddField)."""
    alias = schema_editor.connection.alias
    keys = apps.get_model("django_reliable_executor", "ReliableFairKey").objects.using(alias)
    tasks = apps.get_model("django_reliable_executor", "ReliableTask").objects.using(alias)
    for name in sorted(set(keys.values_list("name", flat=True))):
        groups = set(
            tasks.filter(task_name=name, status__in=UNFINISHED)
            .values_list("queue", "priority")
            .distinct()
        )
        groups.discard(("default", 0))
        rows = list(keys.filter(name=name, queue="default", priority=0))
        keys.bulk_create(
            [
                keys.model(
                    name=name,
                    queue=queue,
                    priority=priority,
                    key=row.key,
                    next_round=row.next_round,
                )
                for queue, priority in sorted(groups)
                for row in rows
            ],
            batch_size=500,
        )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0032_fair_rounds")]

    operations = [
        migrations.RemoveConstraint(model_name="reliablefairkey", name="rexec_fair_key_uniq"),
        migrations.AddField(
            model_name="reliablefairkey",
            name="queue",
            field=models.CharField(default="default", max_length=100),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="reliablefairkey",
            name="priority",
            field=models.IntegerField(default=0),
            preserve_default=False,
        ),
        migrations.RunPython(binary_queue, migrations.RunPython.noop, elidable=False),
        # Reversed: the copies stay, and the old unique constraint then fails on them; delete
        # the table's rows first (the numbering starts again from the rounds being served).
        migrations.RunPython(spread_rows, migrations.RunPython.noop, elidable=False),
        migrations.AddConstraint(
            model_name="reliablefairkey",
            constraint=models.UniqueConstraint(
                fields=("name", "queue", "priority", "key"), name="rexec_fair_key_uniq"
            ),
        ),
        migrations.AddIndex(
            model_name="reliablefairkey",
            index=models.Index(
                fields=["name", "queue", "priority", "next_round"], name="rexec_fair_key_next_idx"
            ),
        ),
    ]
