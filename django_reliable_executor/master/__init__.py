"""The master: the duty one worker at a time holds (lock.py), and what it does while it holds
it (loop.py runs chores.py and schedule_firing.py).

The lease model. Every worker runs a MasterLoop; each round it tries to take or renew the
named lease ``MASTER_LOCK_NAME`` in the storage for ``MASTER_LOCK_TTL`` seconds (a conditional
write: free, expired, or already its own). The holder runs the chores: recover tasks whose
lease lapsed, time out overdue ones, promote due work, purge finished tasks, mark limited
names and fire due schedules, each bounded per round. A master that loses the storage or
stops renewing simply loses the lease when its TTL passes, and another worker takes it.

Holding the lease is an optimisation, not a safety property: every chore is an atomic,
idempotent compare-and-set on the task's state (and a worker's writes are fenced by its
claim's token), so two workers that both believe they are master do no harm; they only do
the same work twice. On a sharded Redis storage each shard's chores have a lock of their own
(``chore_lock_name``), so the chores spread over the workers.
"""
