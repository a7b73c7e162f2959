"""Automatic retries per UTC minute, for the admin's throughput chart (completed and failed tasks
are counted from the task table's finished index; retries leave no row of their own there)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0014_task_progress"),
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
    ]
