"""Per-key concurrency (``max_concurrency_per_key``): a task's ``concurrency_key``, and the table
of the (name, key, queue) ranges whose waiting tasks a claim parked out of its way.

``concurrency_key`` is nullable, so adding it writes no row on PostgreSQL 11+ and MariaDB 10.3+
(an instant ADD COLUMN). On MySQL/MariaDB the keys compare byte for byte, as rate keys do
(0013): "Customer" and "customer" are two tenants.
"""

from django.db import migrations, models


def binary_columns(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_task` MODIFY `concurrency_key` varchar(191) "
        "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"
    )
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_parked_key` "
        "MODIFY `lane` varchar(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "MODIFY `name` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "MODIFY `key` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, "
        "MODIFY `queue` varchar(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [("django_reliable_executor", "0030_durable_waits")]

    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="concurrency_key",
            field=models.CharField(blank=True, max_length=191, null=True),
        ),
        migrations.CreateModel(
            name="ReliableParkedKey",
            fields=[
                ("lane", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=191)),
                ("key", models.CharField(max_length=191)),
                ("queue", models.CharField(max_length=100)),
            ],
            options={
                "db_table": "reliable_executor_parked_key",
                "default_permissions": (),
                "indexes": [models.Index(fields=["name"], name="rexec_parked_key_name_idx")],
            },
        ),
        # Reversed by the column's and the table's removal.
        migrations.RunPython(binary_columns, migrations.RunPython.noop, elidable=False),
    ]
