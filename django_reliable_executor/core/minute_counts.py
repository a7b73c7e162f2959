"""Tasks ended per minute (completed, failed, retried): the minutes, and how storages count them.

The admin's chart reads ``TaskStorage.throughput``. A minute is a whole UTC minute, numbered
from the epoch (``epoch_minute``), so every storage and every process buckets alike.

- **completed**: tasks that ended COMPLETED in the minute (by ``finished_at``);
- **failed**: tasks that ended FAILED, TIMEOUT or ERROR in the minute (the dead letters; a
  CANCELLED task is not a failure: someone chose to stop it);
- **retried**: automatic retries scheduled in the minute: attempts that failed with retries
  left and went back to PENDING, whether the handler raised or its worker was lost (lease
  recovery). Manual retries (``retry_task``) are not counted: nothing failed.

A task counts once per ending: a task retried twice and then completed adds two to *retried*
and one to *completed*, each in its own minute.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
#: How many minutes the admin's chart shows: the current one and the 59 before it.
CHART_MINUTES = 60
#: How long the storages keep their per-minute retry counters (Redis also its ending counts):
#: longer than the chart reaches back, so the oldest minute shown is still complete.
COUNTER_RETENTION_SECONDS = 2 * 3600


def epoch_minute(moment: dt.datetime) -> int:
    """The number of the UTC minute ``moment`` falls in (minutes since the epoch)."""
    return int((moment - EPOCH).total_seconds() // 60)


def minute_start(minute: int) -> dt.datetime:
    """When minute number ``minute`` begins (aware UTC)."""
    return EPOCH + dt.timedelta(minutes=minute)


@dataclasses.dataclass(frozen=True)
class MinuteCounts:
    """Tasks that ended in one UTC minute (see the module docstring for what each counts)."""

    minute: dt.datetime  # when the minute begins, aware UTC
    completed: int = 0
    failed: int = 0
    retried: int = 0

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.retried
