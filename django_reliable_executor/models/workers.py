"""Tables of the running system: the master lock and named leases, the worker registry, API
nonces and live-stack requests."""

from __future__ import annotations

from django.db import models

from ..core.ids import MAX_ID_LENGTH


class ReliableLock(models.Model):
    """A named lease (the master lock): taken and renewed by conditional UPDATE, never held open."""

    name = models.CharField(max_length=100, primary_key=True)
    owner = models.CharField(max_length=MAX_ID_LENGTH, default="")
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "reliable_executor_lock"

    def __str__(self) -> str:
        return f"{self.name} held by {self.owner or 'nobody'} until {self.expires_at}"


class ReliableWorker(models.Model):
    """A runexecutor process, kept fresh by its heartbeat; stale rows are dead workers."""

    worker_id = models.CharField(max_length=MAX_ID_LENGTH, primary_key=True)
    hostname = models.CharField(max_length=MAX_ID_LENGTH, default="")
    pid = models.IntegerField(default=0)
    queues = models.TextField(default="")  # comma-separated: any number of queues
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        db_table = "reliable_executor_worker"

    def __str__(self) -> str:
        return self.worker_id


class ReliableApiNonce(models.Model):
    """A nonce of a signed API request, kept until its signature window has passed."""

    key = models.CharField(max_length=MAX_ID_LENGTH, primary_key=True)  # "<key id>:<nonce>"
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "reliable_executor_api_nonce"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.key} until {self.expires_at}"


class ReliableStackRequest(models.Model):
    """A request for the live stack of a running task's handler (executor.request_stack), and
    its worker's answer once given: storage/database/stacks.py; expired after
    core.stacks.KEEP_SECONDS."""

    request_id = models.CharField(max_length=32, primary_key=True)
    task_id = models.CharField(max_length=MAX_ID_LENGTH)
    worker_id = models.CharField(max_length=MAX_ID_LENGTH)
    requested_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)
    # core.stacks.answer_to_json: the formatted stack (at most 64 Ki characters) and its facts.
    answer = models.TextField(null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "reliable_executor_stack_request"
        default_permissions = ()
        indexes = [
            # The worker's poll: its unanswered requests, the recent ones.
            models.Index(fields=["worker_id", "requested_at"], name="rexec_stack_worker_idx"),
            # The expiry of old requests.
            models.Index(fields=["requested_at"], name="rexec_stack_requested_idx"),
        ]

    def __str__(self) -> str:
        return self.request_id
