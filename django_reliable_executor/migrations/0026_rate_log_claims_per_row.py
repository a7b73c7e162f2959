"""One rate log row per claim round, rate key and time, with the number of claims it counts,
instead of one row per claim: a claim's count of its window reads a row per round, not one
per task, and a round writes (and the trim deletes) one row per key, not one per task. Rows
logged before count one claim each (the default)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_reliable_executor", "0025_rate_log_without_task_index")]
    operations = [
        migrations.AddField(
            model_name="reliableratelog",
            name="claims",
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.RemoveField(model_name="reliableratelog", name="task_id"),
        migrations.RemoveField(model_name="reliableratelog", name="token"),
    ]
