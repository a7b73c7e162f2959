"""A log of handler executions, so tests can count how often each task really ran."""

from django.db import models


class Execution(models.Model):
    task_id = models.CharField(max_length=191, db_index=True)
    attempt = models.IntegerField()
    pid = models.IntegerField()
    started_at = models.DateTimeField(auto_now_add=True)
    finished = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.task_id} attempt {self.attempt} in pid {self.pid}"
