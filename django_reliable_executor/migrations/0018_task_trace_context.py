"""The submitter's W3C trace context (traceparent, tracestate) as JSON, None when untraced."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_reliable_executor", "0017_retry_counts"),
    ]

    operations = [
        migrations.AddField(
            model_name="reliabletask",
            name="trace_context",
            field=models.JSONField(blank=True, null=True),
        ),
    ]
