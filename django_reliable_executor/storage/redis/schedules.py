"""Schedules in the Redis storage: a hash per schedule, indexes by id and by next run."""

from __future__ import annotations

import builtins
import datetime as dt
import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any

from ...core.records import build
from ...core.serialization import dumps
from ...schedules.records import ScheduleInfo
from . import schedule_moves
from .access import READ_CHUNK, guarded
from .codec import MICROSECOND, fields, from_micros, micros, text
from .schedule_skips import ScheduleSkips
from .sharding import CONTROL_SHARD

# Schedule hash fields (see the key layout in storage/redis/__init__.py).
_DEFINITION = {
    "task_name": "n",
    "parameter": "j",
    "every": "ev",
    "cron": "cr",
    "timezone": "tz",
    "start_at": "sa",
    "misfire": "m",
    "queue": "q",
    "priority": "p",
    "retry_limit": "rl",
    "retry_interval": "ri",
    "retry_backoff": "rb",
    "max_duration_millis": "md",
    "origin": "o",
    "overlap": "ov",
}


def _encode(name: str, value: Any) -> str | None:
    """A definition value as the string the hash holds (None: the field is absent)."""
    if value is None:
        return None
    if name == "parameter":
        return dumps(value)
    if name == "every":
        return str(value // MICROSECOND)
    if name == "start_at":
        return micros(value)
    return str(value)


def _encoded(info: ScheduleInfo) -> dict[str, str | None]:
    """A schedule's definition as its hash's fields (None: the field is absent)."""
    return {field: _encode(name, getattr(info, name)) for name, field in _DEFINITION.items()}


def schedule_from_hash(schedule_id: str, values: dict[str, str]) -> ScheduleInfo:
    """A ScheduleInfo from its hash's fields. The master reads a thousand per round: the
    record is built without its __init__."""
    get = values.get
    every = get("ev")
    max_duration = get("md")
    last_run = get("lr")
    last_skipped = get("ol")
    parameter = get("j")
    return build(
        ScheduleInfo,
        {
            "schedule_id": schedule_id,
            "task_name": values["n"],
            "parameter": None if parameter is None else json.loads(parameter),
            "every": None if every is None else dt.timedelta(microseconds=int(every)),
            "cron": get("cr"),
            "timezone": values["tz"],
            "start_at": from_micros(values["sa"]),
            "misfire": values["m"],
            "queue": values["q"],
            "priority": int(values["p"]),
            "retry_limit": int(values["rl"]),
            "retry_interval": int(values["ri"]),
            "retry_backoff": values["rb"],
            "max_duration_millis": None if max_duration is None else int(max_duration),
            "paused": "pa" in values,
            "next_run_at": from_micros(values["nr"]),
            "last_run_at": from_micros(last_run) if last_run else None,
            "last_task_id": get("lt"),
            "origin": values["o"],
            "created_at": from_micros(values["c"]),
            "updated_at": from_micros(values["u"]),
            "overlap": get("ov", "allow"),
            "overlap_skipped": int(get("os", 0)),
            "last_skipped_at": from_micros(last_skipped) if last_skipped else None,
        },
    )


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    """HGETALL's flat reply as a dict (decoded: a borrowed cache client may not decode)."""
    if flat and isinstance(flat[0], bytes):
        flat = [text(item) for item in flat]
    return dict(zip(flat[::2], flat[1::2], strict=False))


class Schedules(ScheduleSkips):
    """``P s:<id>`` hashes, ``P schedules`` (by id), ``P schedules:due`` (active, by next run)
    and ``P schedules:paused``; every change one script.

    Sharded, a schedule lives on its queue's shard (its hash, its indexes, its fires in one
    script there); reads merge the shards, and a save that changes its queue's shard moves it
    (schedule_moves.py)."""

    def _skey(self, schedule_id: str) -> str:
        return self.p + "s:" + schedule_id

    @guarded
    def _save_schedules(
        self, schedules: Sequence[ScheduleInfo], keep: set[str], anchored: set[str]
    ) -> None:
        if not self.sharded:
            self._save_on(schedules, keep, anchored, CONTROL_SHARD)
        else:
            schedule_moves.save(self, schedules, keep, anchored, _encoded, self._save_on)

    def _save_on(
        self, schedules: Sequence[ScheduleInfo], keep: set[str], anchored: set[str], shard: int
    ) -> None:
        """schedule_save.lua on ``shard``, a chunk of schedules a call."""
        for start in range(0, len(schedules), READ_CHUNK):
            items = []
            for info in schedules[start : start + READ_CHUNK]:
                encoded = _encoded(info)
                items.append(
                    {
                        "id": info.schedule_id,
                        "fields": {f: v for f, v in encoded.items() if v is not None},
                        "drop": [f for f, v in encoded.items() if v is None],
                        "next": micros(info.next_run_at),
                        "keep": info.schedule_id in keep,
                        "anchored": info.schedule_id in anchored,
                        "created": micros(info.created_at),
                        "updated": micros(info.updated_at),
                    }
                )
            self._run("schedule_save", json.dumps(items), shard=shard)

    def _read_schedules(self, schedule_ids: Sequence[str]) -> dict[str, ScheduleInfo]:
        if self.sharded:
            held = schedule_moves.copies(self, schedule_ids)
            return {
                i: schedule_from_hash(i, schedule_moves.settled(copies)[1])
                for i, copies in held.items()
            }
        found = self._read_many(schedule_ids, self._skey)
        return {i: schedule_from_hash(i, values) for i, values in found.items()}

    @guarded
    def get_schedules(self, schedule_ids: Sequence[str]) -> dict[str, ScheduleInfo]:
        return self._read_schedules(list(dict.fromkeys(schedule_ids)))

    @guarded
    def list_schedules(
        self, *, limit: int = 100, offset: int = 0, paused: bool | None = None
    ) -> builtins.list[ScheduleInfo]:
        if limit <= 0:
            return []
        if self.sharded:
            return self._list_merged(limit, offset, paused)
        index = self.p + ("schedules:paused" if paused else "schedules")
        if paused is not False:
            ids = [text(i) for i in self.client.zrangebylex(index, "-", "+", offset, limit)]
            found = self._read_schedules(ids)
            return [found[i] for i in ids if i in found]

        def chunks() -> Iterator[tuple[builtins.list[str], dict[str, ScheduleInfo]]]:
            cursor = 0
            while True:
                ids = [
                    text(i) for i in self.client.zrangebylex(index, "-", "+", cursor, READ_CHUNK)
                ]
                if not ids:
                    return
                cursor += len(ids)
                yield ids, self._read_schedules(ids)

        return _active_page(chunks(), limit, offset)

    def _list_merged(
        self, limit: int, offset: int, paused: bool | None
    ) -> builtins.list[ScheduleInfo]:
        """Sharded ``list_schedules``: the shards' id indexes merged in order, each hash read
        on the shard whose index holds it, a schedule caught mid-move listed once."""
        located = schedule_moves.merged_ids(self, "schedules:paused" if paused else "schedules")
        if paused is not False:  # the index is the filter: skip the offset unread
            page = list(itertools.islice(located, offset, offset + limit))
            found = self._read_located(page)
            return [found[i] for i, _ in page if i in found and (paused is None or found[i].paused)]

        def chunks() -> Iterator[tuple[builtins.list[str], dict[str, ScheduleInfo]]]:
            while chunk := list(itertools.islice(located, READ_CHUNK)):
                yield [schedule_id for schedule_id, _ in chunk], self._read_located(chunk)

        return _active_page(chunks(), limit, offset)

    def _read_located(
        self, located: Sequence[tuple[str, Sequence[int]]]
    ) -> dict[str, ScheduleInfo]:
        held = schedule_moves.read_located(self, located)
        return {
            i: schedule_from_hash(i, schedule_moves.settled(copies)[1])
            for i, copies in held.items()
        }

    @guarded
    def count_schedules(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.zcard(prefix + "schedules")
            pipe.zcard(prefix + "schedules:paused")
        replies = [int(n) for n in pipe.execute()]
        total, paused = sum(replies[::2]), sum(replies[1::2])
        return {"active": total - paused, "paused": paused}

    @guarded
    def delete_schedule(self, schedule_id: str) -> bool:
        if not self.sharded:
            return bool(self._run("schedule_delete", schedule_id))
        held = schedule_moves.copies(self, [schedule_id]).get(schedule_id, {})
        return any([bool(self._run("schedule_delete", schedule_id, shard=s)) for s in held])

    @guarded
    def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: dt.datetime
    ) -> ScheduleInfo | None:
        shard = CONTROL_SHARD
        if self.sharded:
            found = schedule_moves.settle(self, schedule_id)
            if found is None:
                return None
            shard = found
        return self._pause_on(schedule_id, paused, now, shard)

    def _pause_on(
        self, schedule_id: str, paused: bool, now: dt.datetime, shard: int
    ) -> ScheduleInfo | None:
        reply = self._run(
            "schedule_pause", schedule_id, "1" if paused else "0", now=now, shard=shard
        )
        if not reply:
            return None
        return schedule_from_hash(schedule_id, fields(reply))

    @guarded
    def due_schedules(self, now: dt.datetime, limit: int) -> builtins.list[ScheduleInfo]:
        due = []
        for shard in range(len(self.prefixes)):
            reply = self._run("schedule_due", limit, now=now, shard=shard)
            for index in range(0, len(reply), 2):
                info = schedule_from_hash(text(reply[index]), _pairs(reply[index + 1]))
                if not info.paused:
                    due.append(info)
        if self.sharded:  # the earliest of every shard's
            due = sorted(due, key=lambda info: info.next_run_at)[:limit]
        return due

    @guarded
    def next_schedule_due(self) -> dt.datetime | None:
        if not self.sharded:
            first = self.client.zrange(self.p + "schedules:due", 0, 0, withscores=True)
            return from_micros(int(first[0][1])) if first else None
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.zrange(prefix + "schedules:due", 0, 0, withscores=True)
        firsts = [int(first[0][1]) for first in pipe.execute() if first]
        return from_micros(min(firsts)) if firsts else None


def _active_page(
    chunks: Iterator[tuple[list[str], dict[str, ScheduleInfo]]], limit: int, offset: int
) -> list[ScheduleInfo]:
    """``list_schedules`` of the active ones: walk the id index in chunks (ids, the schedules
    read of them), skipping the paused (few, as a rule); no chunk is read past the page."""
    result: list[ScheduleInfo] = []
    skipped = 0
    for ids, found in chunks:
        for schedule_id in ids:
            info = found.get(schedule_id)
            if info is None or info.paused:
                continue
            if skipped < offset:
                skipped += 1
            elif len(result) < limit:
                result.append(info)
        if len(result) >= limit:
            break
    return result
