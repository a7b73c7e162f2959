"""DatabaseStorage: tasks as rows of reliable_executor_task, every transition a conditional UPDATE.

Claiming takes a batch with ``SELECT ... FOR UPDATE SKIP LOCKED`` (MariaDB/MySQL, PostgreSQL) or
with one ``UPDATE ... RETURNING`` of the rows a ``LIMIT n`` subquery chose (SQLite; on PostgreSQL
a MATERIALIZED CTE, read once), so
concurrent workers never block on, or take, the same rows. A claim bumps ``lease_token``; every
later write by that worker carries the token in its WHERE clause (the fencing token), so a worker
whose lease expired cannot overwrite what the next holder recorded.
"""

from __future__ import annotations

import builtins

from .batches import Batches
from .chores import Chores
from .claiming import Claiming
from .dependencies import Dependencies
from .locks import Locks
from .parameter_rows import ParameterIndexing
from .pausing import Pausing
from .progress import ProgressReports
from .reading import Reading, ThroughputReading
from .schedule_fires import ScheduleFires
from .schedules import Schedules
from .server_config import mysql_warnings, postgresql_warnings
from .stacks import Stacks
from .steps import Steps
from .submitting import Submitting
from .transitions import Transitions
from .unique_keys import UniqueKeys
from .waits import Waits
from .workers import Workers


class DatabaseStorage(
    Submitting,
    UniqueKeys,
    Dependencies,
    Claiming,
    Transitions,
    ProgressReports,
    Steps,
    Waits,
    ScheduleFires,
    Schedules,
    Chores,
    Locks,
    Workers,
    Reading,
    ThroughputReading,
    Pausing,
    Batches,
    Stacks,
    ParameterIndexing,
):
    """Tasks in the ``reliable_executor_task`` table of one Django database connection: one part
    per role, each built on DatabaseAccess alone, never on another part.

    DatabaseAccess provides the connection (``alias``, ``vendor``), the table (``_tasks``,
    ``_table``), ``get`` (every part reads a task back with it), the SQL helpers
    (``_execute``, ``_dt``, ``_hits``, ``_spans``), retrying deadlock victims
    (``_retrying``) and the retry backoff cap; it declares ``_enqueue``, which Submitting
    implements and Schedules fires through, and ``_take_unique_key``, which UniqueKeys
    implements and Submitting takes unique tasks' keys with. rows.py holds the row/record
    conversions and the SQL fragments the parts share. The rate limits are not a part but
    the RateLog collaborator that Claiming holds (rate_log.py), and the module rate_starts.py
    that Transitions.start_many calls."""

    supports_transactional_enqueue = True
    #: Idle workers wait in wait_for_work (waiting.py): woken by a NOTIFY (PostgreSQL) or the
    #: marker file (SQLite), after a short wait growing with idleness (MariaDB/MySQL).
    blocking_wait = True

    def location(self) -> dict[str, str]:
        return {"backend": "database", "database_alias": self.alias}

    def server_warnings(self) -> builtins.list[str]:
        """What is wrong with the database server's configuration for the task table."""
        if self.vendor == "postgresql":
            return postgresql_warnings(self.alias)
        return mysql_warnings(self.alias) if self.vendor == "mysql" else []


__all__ = ["DatabaseStorage"]
