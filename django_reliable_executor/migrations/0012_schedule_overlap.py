"""Schedules' overlap policy ("allow" | "skip") and the runs skipped because the previous run
was still live (how many, and when last)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        # Both of this branch's migrations follow 0009; 0013 after 0012 keeps one leaf node.
        ("django_reliable_executor", "0011_unique_tasks"),
    ]

    operations = [
        migrations.AddField(
            model_name="reliableschedule",
            name="overlap",
            field=models.CharField(default="allow", max_length=8),
        ),
        migrations.AddField(
            model_name="reliableschedule",
            name="overlap_skipped",
            field=models.BigIntegerField(default=0, help_text="Runs skipped for overlap."),
        ),
        migrations.AddField(
            model_name="reliableschedule",
            name="last_skipped_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
