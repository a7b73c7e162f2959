"""Tables of flow control: names claimed one at a time, parked and fair keys, paused queues,
rate logs and retries per minute."""

from __future__ import annotations

from django.db import models

from ..core.ids import MAX_ID_LENGTH


class ReliableNameLock(models.Model):
    """One row per task name with a ``max_concurrency``: claims of that name lock it (FOR UPDATE,
    or a write on SQLite) for the length of their transaction, so two workers never both see
    the same free slot. It holds no state of its own."""

    name = models.CharField(max_length=MAX_ID_LENGTH, primary_key=True)

    class Meta:
        db_table = "reliable_executor_name_lock"
        default_permissions = ()

    def __str__(self) -> str:
        return self.name


class ReliableParkedKey(models.Model):
    """One row per (task name, ``concurrency_key``, queue) whose waiting tasks a claim parked: found
    over the key's ``max_concurrency_per_key``, they were moved out of the name's range of
    the claim index into a range of their own (``lane``, the value of their
    ``limited_name``), which no claim reads, so later claims do not read past them. The claim
    of the name moves them back as the key's slots free (storage/database/key_parking.py).
    Written only under the name's lock row."""

    lane = models.CharField(max_length=64, primary_key=True)
    name = models.CharField(max_length=MAX_ID_LENGTH)
    key = models.CharField(max_length=MAX_ID_LENGTH)
    queue = models.CharField(max_length=100)  # a range per queue: read in the index's order

    class Meta:
        db_table = "reliable_executor_parked_key"
        default_permissions = ()
        indexes = [models.Index(fields=["name"], name="rexec_parked_key_name_idx")]

    def __str__(self) -> str:
        return f"{self.name} [{self.key}]"


class ReliableFairKey(models.Model):
    """One row per (task name with ``fairness="round_robin"``, queue, priority, key) with tasks
    numbered: the round the key's next task there gets at the earliest (core/fairness.py), per
    queue and priority as the round the claims are at is. Read by submits without a lock and
    raised after their commit; the master's chores delete the rows of keys with nothing
    waiting but keep each (name, queue, priority)'s highest, so numbering never goes back
    (storage/database/fair_rounds.py)."""

    name = models.CharField(max_length=MAX_ID_LENGTH)
    queue = models.CharField(max_length=100)
    priority = models.IntegerField()
    key = models.CharField(max_length=MAX_ID_LENGTH)
    next_round = models.BigIntegerField()

    class Meta:
        db_table = "reliable_executor_fair_key"
        default_permissions = ()
        constraints = [
            models.UniqueConstraint(
                fields=["name", "queue", "priority", "key"], name="rexec_fair_key_uniq"
            )
        ]
        # The highest next round of a queue and priority: one probe (fair_rounds._current).
        indexes = [
            models.Index(
                fields=["name", "queue", "priority", "next_round"], name="rexec_fair_key_next_idx"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.queue}/{self.priority} [{self.key}] {self.next_round}"


class ReliablePausedQueue(models.Model):
    """A paused queue (``executor.pause_queue``): claims take nothing from it while the row is
    here. Its claims read this table in the claiming statement itself."""

    queue = models.CharField(max_length=100, primary_key=True)
    paused_at = models.DateTimeField()

    class Meta:
        db_table = "reliable_executor_paused_queue"
        default_permissions = ()

    def __str__(self) -> str:
        return self.queue


class ReliableRateLog(models.Model):
    """rate_limit's sliding log: one row per claim round, rate key and time of a rate-limited
    task name, counting that round's claims (``claims``), at the claim's time; a start that
    waited too long moves its claim out of the row to one at the start's time. Counted for the
    limit's window (plus its margin, see core/rate_limits.py), then trimmed by a claim of the name
    (at most once per margin in each process). Claims and starts of the name read and write it
    under the name's ReliableNameLock row."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=MAX_ID_LENGTH)
    rate_key = models.CharField(max_length=MAX_ID_LENGTH, default="")  # "": the name's own limit
    claims = models.PositiveIntegerField(default=1)  # how many claims the entry counts
    claimed_at = models.DateTimeField()

    class Meta:
        db_table = "reliable_executor_rate_log"
        default_permissions = ()
        indexes = [
            models.Index(fields=["name", "claimed_at"], name="rexec_rate_log_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} [{self.rate_key}] {self.claims} at {self.claimed_at}"


class ReliableRetryCount(models.Model):
    """Automatic retries scheduled in one UTC minute (failed attempts sent back to PENDING), for
    the admin's throughput chart: one upsert per failure that retries, rows older than two
    hours deleted by the master's purge. Completed and failed tasks need no counter: they are
    counted from the task table's finished index."""

    minute = models.BigIntegerField(primary_key=True)  # throughput.epoch_minute
    retried = models.BigIntegerField(default=0)

    class Meta:
        db_table = "reliable_executor_retry_count"
        default_permissions = ()

    def __str__(self) -> str:
        return f"minute {self.minute}: {self.retried} retried"
