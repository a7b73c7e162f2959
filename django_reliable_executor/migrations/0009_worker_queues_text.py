"""The worker registry holds any queue list the options allow: any number of queue names of up
to 100 characters each (a varchar(1000) overflowed with 11 names of 98 characters, and the
failing registry write once stopped lease renewal)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_reliable_executor', '0008_schedules_per_vendor'),
    ]

    operations = [
        migrations.AlterField(
            model_name='reliableworker',
            name='queues',
            field=models.TextField(default=''),
        ),
    ]
