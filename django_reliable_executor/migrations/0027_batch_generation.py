"""A batch's generation, carried by each of its members: a batch id may be used again once
its batch was purged, and a member still stored counts only in the batch it was submitted
to. Nullable, so adding them writes no row: batches and members stored before both hold NULL,
and still match."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_reliable_executor", "0026_rate_log_claims_per_row")]
    operations = [
        migrations.AddField(
            model_name="reliablebatch",
            name="generation",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
        migrations.AddField(
            model_name="reliabletask",
            name="batch_generation",
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
    ]
