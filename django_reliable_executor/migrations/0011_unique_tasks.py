"""The keys of unique tasks (``unique_for``): one row per key, naming the task holding it."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_reliable_executor", "0010_paused_queues"),
    ]

    operations = [
        migrations.CreateModel(
            name="ReliableUniqueKey",
            fields=[
                ("key", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("task_id", models.CharField(max_length=191)),
                ("expires_at", models.DateTimeField(db_index=True)),
            ],
            options={
                "db_table": "reliable_executor_unique_key",
                "default_permissions": (),
            },
        ),
    ]
