"""The task column has_dependents: set on the tasks a dependent waits for, so that only their
endings read the dependency edges. Set here on every task the edges already name."""

from django.db import migrations, models


def flag_dependencies(apps, schema_editor):
    task = apps.get_model("django_reliable_executor", "ReliableTask")
    edge = apps.get_model("django_reliable_executor", "ReliableDependency")
    quote = schema_editor.connection.ops.quote_name
    # One statement, whatever the number of edges (MySQL cannot name the updated table in
    # its subquery directly, hence the derived table).
    schema_editor.execute(
        f"UPDATE {quote(task._meta.db_table)} SET has_dependents = %s WHERE task_id IN "
        f"(SELECT dependency_id FROM (SELECT DISTINCT dependency_id FROM "
        f"{quote(edge._meta.db_table)}) AS edges)",
        [True],
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [
        ("django_reliable_executor", "0019_batches"),
    ]

    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="has_dependents",
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.RunPython(flag_dependencies, migrations.RunPython.noop, elidable=True),
    ]
