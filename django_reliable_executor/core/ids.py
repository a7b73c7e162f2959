"""Schedule ids, and the ids of the tasks a schedule's runs fire (a namespace submit refuses)."""

from __future__ import annotations

import datetime as dt
import functools
import re
import unicodedata
from typing import Any

from ..exceptions import InvalidScheduleError

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)
_DAY = 86_400_000_000  # microseconds
#: The longest id or name a task, batch, worker, schedule, lock, unique key or rate key has: the
#: width of every id and name column (191 characters of 4 bytes fit MySQL's 767-byte index key).
#: Shipped migrations keep the literal.
MAX_ID_LENGTH = 191
# Leaves room for "@<planned time>" and a Redis shard's "~<k>" within a MAX_ID_LENGTH task id.
MAX_SCHEDULE_ID_LENGTH = 160
# The planned-time part of a fire id: date, time, microseconds only when not zero, "Z".
_FIRE_TIME = re.compile(r"(\d+)(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)(?:\.(\d{6}))?Z", re.ASCII)
# The suffix a sharded Redis storage may add to a fire id to store it on its queue's shard
# (storage/redis/sharding.native_id): "~<k>", k >= 1 without leading zeros.
_SHARD_SUFFIX = re.compile(r"~[1-9]\d*", re.ASCII)
# What follows "<schedule id>@" in a fire id, as a regular expression every database's REGEXP
# and Python's re read alike (no \d, no escapes): the task list's filter of schedule runs
# (list_tasks(schedule_runs=..., schedule_id=...)), the same on every storage.
# Microseconds appear only when not zero (fire_task_id_micros).
_MICROS = (
    "[.]([1-9][0-9]{5}|0[1-9][0-9]{4}|00[1-9][0-9]{3}|000[1-9][0-9]{2}|0000[1-9][0-9]|00000[1-9])"
)
_FIRE_TIME_TEXT = f"[0-9]{{8}}T[0-9]{{6}}({_MICROS})?Z(~[1-9][0-9]*)?$"
# Any schedule's run: "<schedule id>@<planned time>".
FIRE_ID_PATTERN = "^.+@" + _FIRE_TIME_TEXT
# What follows "<schedule id>@" in a run's id, ASCII only (so the same whether a database's
# REGEXP counts bytes or characters): with an exact comparison of the id's first characters
# to "<schedule id>@", the runs of one schedule.
FIRE_TIME_PATTERN = "^" + _FIRE_TIME_TEXT


def fire_task_id(schedule_id: str, planned: dt.datetime) -> str:
    """The id of the task a schedule fires for one planned time: the same for every master
    that fires it, so a run fired twice is stored once. ``nightly@20261129T030000Z``."""
    return fire_task_id_micros(schedule_id, (planned - _EPOCH) // _MICROSECOND)


def fire_task_id_micros(schedule_id: str, planned: int) -> str:
    """``fire_task_id`` of a planned time given in microseconds since the epoch (the master's
    hot path: a thousand per round, where strftime on a datetime cost more than the rest)."""
    days, rest = divmod(planned, _DAY)
    seconds, fraction = divmod(rest, 1_000_000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    tail = f".{fraction:06d}Z" if fraction else "Z"
    return f"{schedule_id}@{_date(days)}T{hours:02d}{minutes:02d}{seconds:02d}{tail}"


@functools.lru_cache(maxsize=1024)
def _date(days: int) -> str:
    """The date part of a fire id, for a day counted from the epoch."""
    return f"{_EPOCH + dt.timedelta(days=days):%Y%m%d}"


def is_fire_task_id(task_id: str) -> bool:
    """Whether ``fire_task_id`` gives this (otherwise valid) task id for some schedule id and
    planned time. That namespace is reserved to firing: a plain submit taking a run's id first
    would make the schedule find its run already stored, and fire nothing. A fire id followed
    by ``~<k>`` (k >= 1: the form a sharded Redis storage gives a run to store it on its
    queue's shard) is reserved too. Exact: ids of another form, such as ``a@b``,
    ``x@20261129T030000.000000Z`` or ``x@20261129T030000Z~0``, stay free."""
    base, tilde, suffix = task_id.rpartition("~")
    if tilde and _SHARD_SUFFIX.fullmatch(tilde + suffix):
        task_id = base
    schedule_id, at, planned = task_id.rpartition("@")
    match = _FIRE_TIME.fullmatch(planned)
    if not at or not match or not 1 <= len(schedule_id) <= MAX_SCHEDULE_ID_LENGTH:
        return False
    year, month, day, hour, minute, second = map(int, match.groups()[:6])
    try:
        time = dt.datetime(
            year, month, day, hour, minute, second, int(match[7] or 0), tzinfo=dt.timezone.utc
        )
    except ValueError:  # no such date or time: no fire has this id
        return False
    return fire_task_id(schedule_id, time) == task_id


def validate_schedule_id(schedule_id: Any) -> str:
    if not isinstance(schedule_id, str) or not 1 <= len(schedule_id) <= MAX_SCHEDULE_ID_LENGTH:
        raise InvalidScheduleError(
            f"schedule_id must be a string of 1..{MAX_SCHEDULE_ID_LENGTH} characters, "
            f"got {schedule_id!r}",
            field="schedule_id",
        )
    for char in schedule_id:
        if char.isspace() or unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp"):
            raise InvalidScheduleError(
                f"schedule_id {schedule_id!r} contains whitespace or a control character "
                f"({char!r})",
                field="schedule_id",
            )
    return schedule_id
