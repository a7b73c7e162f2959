"""The Redis storage's counts of runs skipped by a schedule's overlap policy, per UTC hour."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence

from ..schedule_base import SKIP_HOURS, epoch_hour, hour_start
from .access import RedisAccess, guarded
from .codec import text

logger = logging.getLogger("django_reliable_executor")

# The key lives a little longer than the hours it counts; an hour's field older than that is
# deleted by the schedule's next skip.
_KEY_SECONDS = (SKIP_HOURS + 1) * 3600


class ScheduleSkips(RedisAccess):
    """``P sskip:<schedule id>``: a HASH per schedule with skips, field = epoch hour, value =
    runs skipped then; on the control shard (statistics of the pages, not of a queue)."""

    def _skip_key(self, schedule_id: str) -> str:
        return self.p + "sskip:" + schedule_id

    @guarded
    def add_schedule_skips(self, skips: Sequence[tuple[str, int]], now: dt.datetime) -> None:
        counted = [(schedule_id, n) for schedule_id, n in skips if n > 0]
        if not counted:
            return
        hour = epoch_hour(now)
        pipe = self.client.pipeline(transaction=False)
        for schedule_id, n in counted:
            key = self._skip_key(schedule_id)
            pipe.hincrby(key, str(hour), n)
            pipe.expire(key, _KEY_SECONDS)
            pipe.hkeys(key)
        replies = pipe.execute()
        stale = self.client.pipeline(transaction=False)
        for (schedule_id, _), fields in zip(counted, replies[2::3], strict=True):
            old = [f for f in map(text, fields) if int(f) < hour - SKIP_HOURS]
            if old:
                stale.hdel(self._skip_key(schedule_id), *old)
        stale.execute()

    @guarded
    def schedule_skips(self, schedule_id: str, since: dt.datetime) -> dict[dt.datetime, int]:
        first = epoch_hour(since)
        counts = self.client.hgetall(self._skip_key(schedule_id))
        return {
            hour_start(int(text(field))): int(value)
            for field, value in counts.items()
            if int(text(field)) >= first
        }
