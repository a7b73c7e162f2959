"""The task's progress: the handler's last set_progress() as JSON, None before any."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0013_rate_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="progress",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
