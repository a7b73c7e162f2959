"""Batches: an index on finished_at, so the purge finds the batches past retention without
reading the whole batch table."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0020_task_has_dependents"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="reliablebatch",
            index=models.Index(fields=["finished_at"], name="rexec_batch_finished_idx"),
        ),
    ]
