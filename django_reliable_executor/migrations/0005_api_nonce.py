"""The nonce table of the HTTP API's signed requests; on MySQL/MariaDB its key compares byte for
byte (as in 0002), so nonces differing only in case stay two nonces."""

from django.db import migrations, models


def binary_key(apps, schema_editor):
    if schema_editor.connection.vendor != "mysql":
        return
    schema_editor.execute(
        "ALTER TABLE `reliable_executor_api_nonce` "
        "MODIFY `key` varchar(191) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL"
    )


class Migration(migrations.Migration):
    atomic = False  # MySQL DDL cannot run inside a transaction
    dependencies = [
        ("django_reliable_executor", "0004_operate_permission"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReliableApiNonce",
            fields=[
                ("key", models.CharField(max_length=191, primary_key=True, serialize=False)),
                ("expires_at", models.DateTimeField(db_index=True)),
            ],
            options={
                "db_table": "reliable_executor_api_nonce",
                "default_permissions": (),
            },
        ),
        migrations.RunPython(binary_key, migrations.RunPython.noop, elidable=False),
    ]
