"""A task's attempt_timeout: seconds each attempt may run. Nullable, so adding it writes no
row: tasks stored before hold NULL (no limit of their own; the handler's applies, if any)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_reliable_executor", "0027_batch_generation")]
    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="attempt_timeout",
            field=models.FloatField(
                blank=True, help_text="Seconds each attempt may run.", null=True
            ),
        ),
    ]
