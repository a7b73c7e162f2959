"""The names of the locks whose holders run the master's chores, shard by shard."""

from __future__ import annotations

#: The lock whose holder is the master (runs the chores); the service reports who holds it.
MASTER_LOCK_NAME = "master"


def chore_lock_name(shard: int) -> str:
    """The lock of the chores of ``shard`` (TaskStorage.chore_shards): shard 0's is the master
    lock, whose holder also runs the control duties (schedules, batches, worker registry)."""
    return MASTER_LOCK_NAME if shard == 0 else f"{MASTER_LOCK_NAME}:shard-{shard}"
