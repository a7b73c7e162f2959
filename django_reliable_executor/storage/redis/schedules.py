"""Schedules in the Redis storage: a hash per schedule, indexes by id and by next run."""

from __future__ import annotations

import builtins
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from ...records import TaskInfo, new_info
from ...schedules.records import ScheduleFire, ScheduleInfo
from ...serialization import dumps
from .access import READ_CHUNK, RedisAccess, guarded
from .codec import MICROSECOND, fields, from_micros, micros, submit_args, text

FIRE_CHUNK = 500  # tasks (and schedules) per fire script call, as SUBMIT_CHUNK for submits

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


def schedule_from_hash(schedule_id: str, values: dict[str, str]) -> ScheduleInfo:
    def optional_int(key: str) -> int | None:
        return int(values[key]) if key in values else None

    every = optional_int("ev")
    last_run = values.get("lr")
    return ScheduleInfo(
        schedule_id=schedule_id,
        task_name=values["n"],
        parameter=json.loads(values["j"]) if "j" in values else None,
        every=None if every is None else dt.timedelta(microseconds=every),
        cron=values.get("cr"),
        timezone=values["tz"],
        start_at=from_micros(values["sa"]),
        misfire=values["m"],
        queue=values["q"],
        priority=int(values["p"]),
        retry_limit=int(values["rl"]),
        retry_interval=int(values["ri"]),
        retry_backoff=values["rb"],
        max_duration_millis=optional_int("md"),
        paused="pa" in values,
        next_run_at=from_micros(values["nr"]),
        last_run_at=from_micros(last_run) if last_run else None,
        last_task_id=values.get("lt"),
        origin=values["o"],
        created_at=from_micros(values["c"]),
        updated_at=from_micros(values["u"]),
    )


class Schedules(RedisAccess):
    """``P s:<id>`` hashes, ``P schedules`` (by id), ``P schedules:due`` (active, by next run)
    and ``P schedules:paused``; every change one script."""

    def _skey(self, schedule_id: str) -> str:
        return self.p + "s:" + schedule_id

    @guarded
    def _save_schedules(
        self, schedules: Sequence[ScheduleInfo], keep: set[str], anchored: set[str]
    ) -> None:
        for start in range(0, len(schedules), READ_CHUNK):
            items = []
            for info in schedules[start : start + READ_CHUNK]:
                encoded = {
                    field: _encode(name, getattr(info, name)) for name, field in _DEFINITION.items()
                }
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
            self._run("schedule_save", json.dumps(items))

    def _read_schedules(self, schedule_ids: Sequence[str]) -> dict[str, ScheduleInfo]:
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
        index = self.p + ("schedules:paused" if paused else "schedules")
        if paused is not False:
            ids = [text(i) for i in self.client.zrangebylex(index, "-", "+", offset, limit)]
            found = self._read_schedules(ids)
            return [found[i] for i in ids if i in found]
        # Active ones: walk the id index, skipping the paused (few, as a rule).
        result: builtins.list[ScheduleInfo] = []
        skipped, cursor = 0, 0
        while len(result) < limit:
            ids = [text(i) for i in self.client.zrangebylex(index, "-", "+", cursor, READ_CHUNK)]
            if not ids:
                break
            cursor += len(ids)
            found = self._read_schedules(ids)
            for schedule_id in ids:
                info = found.get(schedule_id)
                if info is None or info.paused:
                    continue
                if skipped < offset:
                    skipped += 1
                elif len(result) < limit:
                    result.append(info)
        return result

    @guarded
    def count_schedules(self) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.p + "schedules")
        pipe.zcard(self.p + "schedules:paused")
        total, paused = pipe.execute()
        return {"active": int(total) - int(paused), "paused": int(paused)}

    @guarded
    def delete_schedule(self, schedule_id: str) -> bool:
        return bool(self._run("schedule_delete", schedule_id))

    @guarded
    def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: dt.datetime
    ) -> ScheduleInfo | None:
        reply = self._run("schedule_pause", schedule_id, "1" if paused else "0", now=now)
        if not reply:
            return None
        return schedule_from_hash(schedule_id, fields(reply))

    @guarded
    def due_schedules(self, now: dt.datetime, limit: int) -> builtins.list[ScheduleInfo]:
        reply = self._run("schedule_due", limit, now=now)
        due = []
        for index in range(0, len(reply), 2):
            info = schedule_from_hash(text(reply[index]), fields(reply[index + 1]))
            if not info.paused:
                due.append(info)
        return due

    @guarded
    def next_schedule_due(self) -> dt.datetime | None:
        first = self.client.zrange(self.p + "schedules:due", 0, 0, withscores=True)
        return from_micros(int(first[0][1])) if first else None

    @guarded
    def fire_schedules(
        self, fires: Sequence[ScheduleFire], now: dt.datetime
    ) -> builtins.list[TaskInfo]:
        """Each fire is one script: the check that its schedule still expects it, its tasks
        and the schedule's move happen together or not at all (a schedule paused or deleted
        after the planning fires nothing). A call carries whole fires, about SUBMIT_CHUNK
        tasks' worth."""
        created: builtins.list[TaskInfo] = []
        batch: builtins.list[ScheduleFire] = []
        size = 0
        for fire in fires:
            batch.append(fire)
            size += len(fire.tasks) + 1
            if size >= FIRE_CHUNK or len(batch) >= READ_CHUNK:
                created += self._fire(batch, now)
                batch, size = [], 0
        if batch:
            created += self._fire(batch, now)
        return created

    def _fire(self, fires: Sequence[ScheduleFire], now: dt.datetime) -> builtins.list[TaskInfo]:
        args: builtins.list[str] = []
        for fire in fires:
            args += [
                fire.schedule_id,
                micros(fire.expected_next_run_at),
                micros(fire.next_run_at),
                "" if fire.last_run_at is None else micros(fire.last_run_at),
                fire.last_task_id or "",
                str(len(fire.tasks)),
            ]
            for task in fire.tasks:
                args += submit_args(task)
        replies = self._run("schedule_fire", *args, now=now)
        created = []
        for fire, reply in zip(fires, replies, strict=True):
            if reply:  # [1, per task 1 (created) or 0]
                created += [
                    new_info(task)
                    for task, was_created in zip(fire.tasks, reply[1:], strict=True)
                    if was_created
                ]
        return created
