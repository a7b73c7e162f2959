"""DatabaseStorage: tasks as rows of reliable_executor_task, every transition a conditional UPDATE.

Claiming takes a batch with ``SELECT ... FOR UPDATE SKIP LOCKED`` (MariaDB/MySQL, PostgreSQL) or
with one ``UPDATE ... WHERE task_id IN (SELECT ... LIMIT n) RETURNING`` (SQLite, PostgreSQL), so
concurrent workers never block on, or take, the same rows. A claim bumps ``lease_token``; every
later write by that worker carries the token in its WHERE clause (the fencing token), so a worker
whose lease expired cannot overwrite what the next holder recorded.
"""

from __future__ import annotations

from .chores import Chores
from .claiming import Claiming
from .locks import Locks
from .reading import Reading
from .schedules import Schedules
from .submitting import Submitting
from .transitions import Transitions
from .workers import Workers


class DatabaseStorage(
    Submitting, Claiming, Transitions, Schedules, Chores, Locks, Workers, Reading
):
    """Tasks in the ``reliable_executor_task`` table of one Django database connection: one part
    per role, each over DatabaseAccess (the connection, table and SQL helpers)."""

    supports_transactional_enqueue = True


__all__ = ["DatabaseStorage"]
