"""Tables of tasks: the task rows, their dependencies, durable steps, tags, searchable
parameters, events, unique keys and batches."""

from __future__ import annotations

from django.db import models

from ..core.ids import MAX_ID_LENGTH
from ..core.parameter_index import MAX_KEY_CHARS, MAX_VALUE_CHARS
from ..core.states import TaskStatus


class ReliableTask(models.Model):
    """One task. Only DatabaseStorage writes these rows; all else goes through the service."""

    task_id = models.CharField(max_length=MAX_ID_LENGTH, primary_key=True)
    task_name = models.CharField(max_length=MAX_ID_LENGTH)
    status = models.CharField(
        max_length=16, choices=[(s.value, s.value) for s in TaskStatus], default="CREATED"
    )
    queue = models.CharField(max_length=100, default="default")
    priority = models.IntegerField(default=0)
    parameter = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="Executions ever started.")
    budget_attempts = models.PositiveIntegerField(
        default=0, help_text="Executions since the retry budget was last reset."
    )
    retry_limit = models.PositiveIntegerField(default=3)
    retry_interval = models.BigIntegerField(default=2000, help_text="Milliseconds.")
    retry_backoff = models.CharField(max_length=16, default="fixed")
    max_duration_millis = models.BigIntegerField(null=True, blank=True)
    # None: no limit of its own (the handler's attempt_timeout applies, if any).
    attempt_timeout = models.FloatField(
        null=True, blank=True, help_text="Seconds each attempt may run."
    )
    created_at = models.DateTimeField()
    run_at = models.DateTimeField(help_text="Next time the task may start.")
    deadline_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)  # noqa: DJ001 - None: no error yet
    worker_id = models.CharField(max_length=MAX_ID_LENGTH, null=True, blank=True)  # noqa: DJ001
    cancel_requested = models.BooleanField(default=False)
    # The handler's last set_progress() (progress.Progress as JSON); None before any.
    progress = models.JSONField(null=True, blank=True)
    # The submitter's W3C trace context ({"traceparent": ..., "tracestate": ...}); None when
    # it was not traced (see tracing.py).
    trace_context = models.JSONField(null=True, blank=True)
    # True while the task waits for a worker (CREATED/PENDING and not claimed): the claim index.
    available = models.BooleanField(default=True)
    # The task's name when that name had a rate_limit or a max_concurrency as it was stored,
    # else "": the claim index's second column. Workers claim such tasks one name at a time,
    # each from its name's own range, and the claim of all other names reads the "" range
    # only, never past a name's backlog held at its limit. Put right by the master's chores
    # when a name gains or loses its limits (storage/database/chores.py).
    limited_name = models.CharField(max_length=MAX_ID_LENGTH, default="", db_default="", blank=True)
    # Fencing token: bumped by every claim; every write by the claimer must match it.
    lease_token = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # rate_limit: tasks of one name sharing this key share one limit (None: the name's own).
    rate_key = models.CharField(max_length=MAX_ID_LENGTH, null=True, blank=True)  # noqa: DJ001
    # max_concurrency_per_key: tasks of one name sharing this key share one cap (None: none).
    concurrency_key = models.CharField(  # noqa: DJ001
        max_length=MAX_ID_LENGTH, null=True, blank=True
    )
    # fairness="round_robin": the task's turn among its name's keys (core/fairness.py), the
    # claim index's order after priority; 0 for the tasks of every other name.
    flow_round = models.BigIntegerField(default=0, db_default=0)
    # Dependencies (dependencies.py): the ids it was submitted to wait for, those still awaited
    # (None once none is: released, or never had any), and what a failed one does to it.
    depends_on = models.JSONField(null=True, blank=True)
    waiting_for = models.JSONField(null=True, blank=True)
    # None: "cancel" (hand-written INSERTs of tasks without dependencies leave it out).
    on_dependency_failure = models.CharField(max_length=8, null=True, blank=True)  # noqa: DJ001
    # True once a dependent was stored to wait for it (set by that submit, never cleared): only
    # the ending of such a task reads reliable_executor_dependency (dependencies.py). A default
    # in the database too: the hand-written INSERTs of the submits leave it out.
    has_dependents = models.BooleanField(default=False, db_default=False)
    # A PENDING task's durable wait (core/waits.py: TaskInfo.waiting), None otherwise; and
    # how many times its handler was resumed after a wait or a stop. A default in the database
    # for the hand-written INSERTs of the submits, which leave them out.
    waiting = models.JSONField(null=True, blank=True)
    resumptions = models.PositiveIntegerField(default=0, db_default=0)
    # The batch this task is a member or a callback of (ReliableBatch); None for most tasks.
    batch_id = models.CharField(max_length=MAX_ID_LENGTH, null=True, blank=True)  # noqa: DJ001
    # Which batch of that id (ReliableBatch.generation): a member counts only in the batch it
    # was submitted to, not in a later one reusing the id of its purged batch.
    batch_generation = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
    # The tags it was submitted with (a JSON list, None for none): what its TaskInfo reads;
    # ReliableTaskTag indexes them. A default in the database for the hand-written INSERTs.
    tags = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "reliable_executor_task"
        verbose_name = "reliable task"
        # Viewing uses Django's view permission; retrying and cancelling from the admin (or
        # anywhere a project checks it) needs this one. add/change/delete are never granted
        # by the admin, whatever a user holds: rows change only through the service.
        permissions = [("operate_reliabletask", "Can retry and cancel reliable tasks")]
        indexes = [
            # Claim: equality on available+limited_name+queue, then the exact pickup order
            # (flow_round is 0 but for names with fairness: then priority, run_at).
            # Partial on PostgreSQL (migrations 0003, 0024): only waiting rows are in it there.
            models.Index(
                fields=["available", "limited_name", "queue", "-priority", "flow_round", "run_at"],
                name="rexec_claim_idx",
            ),
            models.Index(fields=["lease_expires_at"], name="rexec_lease_idx"),
            models.Index(fields=["deadline_at"], name="rexec_deadline_idx"),
            models.Index(fields=["status", "created_at"], name="rexec_status_idx"),
            models.Index(fields=["queue", "status"], name="rexec_queue_status_idx"),
            models.Index(fields=["task_name", "status"], name="rexec_name_status_idx"),
            # Purge (finished before, of some statuses), the admin's chart (finished in the
            # last hour, by status) and its sparklines (completed in the last hour, by queue):
            # status and queue in the index, so none reads rows. Partial on PostgreSQL (0003,
            # 0017, 0034): only finished rows are in it there.
            models.Index(fields=["finished_at", "status", "queue"], name="rexec_finished_idx"),
            models.Index(fields=["created_at"], name="rexec_created_idx"),
            models.Index(fields=["batch_id", "status"], name="rexec_batch_idx"),
            # max_concurrency: count the held (claimed, not finished) tasks of one name.
            # Partial on PostgreSQL (migration 0006): only held rows are in it there.
            models.Index(fields=["task_name", "available", "status"], name="rexec_held_idx"),
            # rate_limit: a name's waiting tasks of keys other than those held at their limit,
            # found without reading the held backlog (written once, at the insert).
            models.Index(fields=["task_name", "rate_key"], name="rexec_rate_key_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} [{self.task_id}] {self.status}"


class ReliableDependency(models.Model):
    """One edge "``dependent_id`` waits for ``dependency_id``": what the write ending a task
    reads to settle its dependents (dependencies.py), in the same transaction. Deleted with
    the tasks when they are purged."""

    id = models.BigAutoField(primary_key=True)
    dependency_id = models.CharField(max_length=MAX_ID_LENGTH)
    dependent_id = models.CharField(max_length=MAX_ID_LENGTH)

    class Meta:
        db_table = "reliable_executor_dependency"
        default_permissions = ()
        indexes = [
            models.Index(fields=["dependency_id"], name="rexec_dependency_idx"),
            models.Index(fields=["dependent_id"], name="rexec_dependent_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.dependent_id} waits for {self.dependency_id}"


class ReliableTaskStep(models.Model):
    """A durable step's checkpoint (``context.step``): the result step ``name`` of task
    ``task_id`` returned, stored by the attempt holding ``token`` (the task's fencing token
    then). The id orders a task's steps as they finished: a step stored again is deleted and
    inserted anew. Written and read only by storage/database/steps.py; deleted with the task
    by the purge, and from a step on by a manual retry ``from_step``."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(max_length=MAX_ID_LENGTH)
    name = models.CharField(max_length=MAX_ID_LENGTH)
    result = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField()
    token = models.BigIntegerField()

    class Meta:
        db_table = "reliable_executor_task_step"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["task_id", "name"], name="rexec_step_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} step {self.name}"


class ReliableTaskTag(models.Model):
    """One tag of one task (the submit option ``tags``): what ``list_tasks(tag=...)`` reads,
    the tag's tasks found by the unique index without reading other rows. Inserted with the
    task (storage/database/submitting.py), deleted with it by the purge (step_rows.py)."""

    id = models.BigAutoField(primary_key=True)
    tag = models.CharField(max_length=64)
    task_id = models.CharField(max_length=MAX_ID_LENGTH)

    class Meta:
        db_table = "reliable_executor_task_tag"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["tag", "task_id"], name="rexec_tag_unique"),
        ]
        indexes = [models.Index(fields=["task_id"], name="rexec_tag_task_idx")]

    def __str__(self) -> str:
        return f"{self.task_id} tag {self.tag}"


class ReliableTaskParameter(models.Model):
    """One searchable parameter value of one task (setting SEARCHABLE_PARAMETERS): a top-level
    key and its value's canonical JSON text (core/parameter_index.py), what
    ``list_tasks(parameter=...)`` reads to find the value's tasks without reading other rows.
    Inserted with the task (storage/database/submitting.py), replaced when a debounced submit
    joins it, deleted with it by the purge (step_rows.py); ``executor index-parameters`` fills
    those of tasks stored before their key was searchable. SQLite and MySQL/MariaDB only:
    PostgreSQL's GIN index of the parameters (migration 0036) answers every key there."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=MAX_KEY_CHARS)
    value = models.CharField(max_length=MAX_VALUE_CHARS)
    task_id = models.CharField(max_length=MAX_ID_LENGTH)

    class Meta:
        db_table = "reliable_executor_task_param"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["key", "value", "task_id"], name="rexec_param_unique"),
        ]
        indexes = [models.Index(fields=["task_id"], name="rexec_param_task_idx")]

    def __str__(self) -> str:
        return f"{self.task_id} {self.key}={self.value}"


class ReliableTaskEvent(models.Model):
    """An event sent to a task (``executor.send_event``), which ``context.wait_for_event`` of
    that name returns: the first payload sent is kept (unique on task and name). Written and
    read by storage/database/waits.py; deleted with the task by the purge."""

    id = models.BigAutoField(primary_key=True)
    task_id = models.CharField(max_length=MAX_ID_LENGTH)
    name = models.CharField(max_length=MAX_ID_LENGTH)
    payload = models.JSONField(null=True, blank=True)
    sent_at = models.DateTimeField()

    class Meta:
        db_table = "reliable_executor_task_event"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(fields=["task_id", "name"], name="rexec_event_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} event {self.name}"


class ReliableUniqueKey(models.Model):
    """The key of a unique task (``unique_for``): which task holds it, and until when. The
    primary key makes concurrent submits of one key wait for each other; a row past its
    ``expires_at``, or whose task is finished, is taken over by the next submit or deleted by
    the master's purge."""

    key = models.CharField(max_length=64, primary_key=True)  # uniqueness.unique_digest
    task_id = models.CharField(max_length=MAX_ID_LENGTH)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        db_table = "reliable_executor_unique_key"
        default_permissions = ()

    def __str__(self) -> str:
        return f"{self.key} held by {self.task_id} until {self.expires_at}"


class ReliableBatch(models.Model):
    """One batch (executor.submit_batch): counters of its members' endings, kept by each
    member's ending write, and its callbacks until it finishes (see batches.py)."""

    batch_id = models.CharField(max_length=MAX_ID_LENGTH, primary_key=True)
    total = models.PositiveIntegerField(default=0, help_text="Members stored.")
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0, help_text="FAILED, TIMEOUT and ERROR.")
    cancelled = models.PositiveIntegerField(default=0)
    # False while the submit stores members; the fan-in happens only once sealed.
    sealed = models.BooleanField(default=False)
    # {"on_complete": {...}, "on_success": {...}} as batches.callback_to_json writes them.
    callbacks = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # Tells this batch from an earlier, purged one of the same id: its members carry it
    # (ReliableTask.batch_generation). NULL for a batch stored before it existed, whose
    # members carry NULL too.
    generation = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001

    class Meta:
        db_table = "reliable_executor_batch"
        verbose_name = "reliable batch"
        verbose_name_plural = "reliable batches"
        indexes = [
            models.Index(fields=["created_at"], name="rexec_batch_created_idx"),
            # The purge's: finished batches past retention, oldest first.
            models.Index(fields=["finished_at"], name="rexec_batch_finished_idx"),
        ]

    def __str__(self) -> str:
        return self.batch_id
