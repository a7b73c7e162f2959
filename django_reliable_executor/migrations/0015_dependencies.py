"""Task dependencies: the dependency edges table and the task columns depends_on, waiting_for,
on_dependency_failure."""


from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_reliable_executor', '0014_task_progress'),
    ]

    operations = [
        migrations.AddField(
            model_name='reliabletask',
            name='depends_on',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='reliabletask',
            name='on_dependency_failure',
            field=models.CharField(blank=True, max_length=8, null=True),
        ),
        migrations.AddField(
            model_name='reliabletask',
            name='waiting_for',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name='ReliableDependency',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('dependency_id', models.CharField(max_length=191)),
                ('dependent_id', models.CharField(max_length=191)),
            ],
            options={
                'db_table': 'reliable_executor_dependency',
                'default_permissions': (),
                'indexes': [models.Index(fields=['dependency_id'], name='rexec_dependency_idx'), models.Index(fields=['dependent_id'], name='rexec_dependent_idx')],
            },
        ),
    ]
