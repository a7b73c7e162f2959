"""rate_limit: an index on (task_name, rate_key), so that a claim finds a name's waiting tasks
of keys other than those held at their limit without reading the held backlog."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0015_dependencies"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="reliabletask",
            index=models.Index(fields=["task_name", "rate_key"], name="rexec_rate_key_idx"),
        ),
    ]
