"""Drop the rate log's index on task_id: a start that moves its claim's entry finds it by the
name and the time it was logged at (the index on name, claimed_at), so the index on task ids
only cost every claim of a rate-limited name one more index entry per task, in a random place,
written and then deleted again by the trim."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_reliable_executor", "0024_claim_index_limited_name")]
    operations = [
        migrations.RemoveIndex(model_name="reliableratelog", name="rexec_rate_log_task_idx"),
    ]
