"""Schedules in the Redis storage: a hash per schedule, indexes by id and by next run."""

from __future__ import annotations

import builtins
import datetime as dt
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from ...records import TaskInfo, build, created_info, new_info
from ...schedules.ids import fire_task_id_micros
from ...schedules.planning import overlap_runs, plan, plan_interval
from ...schedules.records import FiringRound, ScheduleFire, ScheduleInfo
from ...serialization import dumps
from . import schedule_moves
from .access import READ_CHUNK, RedisAccess, guarded
from .codec import EPOCH, MICROSECOND, fields, from_micros, micros, submit_args, text
from .schedule_overlap import overlap_flag, overlap_skipped
from .sharding import CONTROL_SHARD, native_id

# A planned fire on the hashes' strings: schedule id, its hash fields, its runs and its next run
# (microseconds).
_Fire = tuple[str, dict[str, str], list[int], int]


class _RoundClock(NamedTuple):
    """A firing round's now and misfire grace, also in whole microseconds (computed once a
    round, not once a schedule)."""

    now: dt.datetime
    now_us: int
    grace: dt.timedelta
    grace_us: int


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


# The fields the master's round reads of each due schedule: to plan it (a cron one is then read
# in full) and to fire it.
FIRING_FIELDS = (
    *("nr", "ev", "sa", "m", "pa", "cr", "n", "q", "p", "j", "rl", "ri", "rb", "md"),
    "ov",
)


def _present(values: Sequence[Any]) -> dict[str, str]:
    """schedule_due.lua's FIRING_FIELDS values as a dict of the fields present."""
    if values and isinstance(values[0], bytes):  # nr: every schedule has one
        values = [None if value is None else text(value) for value in values]
    return {
        field: value
        for field, value in zip(FIRING_FIELDS, values, strict=True)
        if value is not None
    }


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    """HGETALL's flat reply as a dict (decoded: a borrowed cache client may not decode)."""
    if flat and isinstance(flat[0], bytes):
        flat = [text(item) for item in flat]
    return dict(zip(flat[::2], flat[1::2], strict=False))


class Schedules(RedisAccess):
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

    def _list_merged(
        self, limit: int, offset: int, paused: bool | None
    ) -> builtins.list[ScheduleInfo]:
        """Sharded ``list_schedules``: the shards' id indexes merged in order, read a chunk at
        a time, a schedule caught mid-move listed once."""
        index = "schedules:paused" if paused else "schedules"
        result: builtins.list[ScheduleInfo] = []
        skipped = 0
        ids = schedule_moves.merged_ids(self, index)
        while len(result) < limit:
            chunk = [i for _, i in zip(range(READ_CHUNK), ids, strict=False)]
            if not chunk:
                break
            found = self._read_schedules(chunk)
            for schedule_id in chunk:
                info = found.get(schedule_id)
                if info is None or (paused is not None and info.paused != paused):
                    continue
                if skipped < offset:
                    skipped += 1
                elif len(result) < limit:
                    result.append(info)
        return result

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

    @guarded
    def fire_schedules(
        self,
        fires: Sequence[ScheduleFire],
        now: dt.datetime,
        overlapped: builtins.list[tuple[str, str, int]] | None = None,
    ) -> builtins.list[TaskInfo]:
        """Each fire is one script: the check that its schedule still expects it, its tasks
        and the schedule's move happen together or not at all (a schedule paused or deleted
        after the planning fires nothing). A call carries whole fires, about SUBMIT_CHUNK
        tasks' worth.

        Sharded, a fire goes to the shard of its tasks' queue (where its schedule lives; one
        that moved away meanwhile finds nothing to fire there), its task ids made native to
        that shard (sharding.native_id)."""
        if not self.sharded:
            return self._fire_on(fires, now, overlapped, CONTROL_SHARD)
        shards = self.layout.shards
        located = self._schedule_shards([f.schedule_id for f in fires if not f.tasks])
        by_shard: dict[int, builtins.list[ScheduleFire]] = {}
        for fire in fires:
            if fire.tasks:
                shard = self.layout.shard_of(fire.tasks[0].queue)
            elif fire.schedule_id in located:
                shard = located[fire.schedule_id]
            else:
                continue  # no such schedule any more: nothing to fire
            by_shard.setdefault(shard, []).append(schedule_moves.native_fire(fire, shard, shards))
        created: builtins.list[TaskInfo] = []
        for shard, part in sorted(by_shard.items()):
            created += self._fire_on(part, now, overlapped, shard)
        return created

    def _schedule_shards(self, schedule_ids: Sequence[str]) -> dict[str, int]:
        """The shard of each of these schedules that is not moving away (unknown ids left out)."""
        held = schedule_moves.copies(self, schedule_ids) if schedule_ids else {}
        return {i: schedule_moves.settled(copies)[0] for i, copies in held.items()}

    def _fire_on(
        self,
        fires: Sequence[ScheduleFire],
        now: dt.datetime,
        overlapped: builtins.list[tuple[str, str, int]] | None,
        shard: int,
    ) -> builtins.list[TaskInfo]:
        created: builtins.list[TaskInfo] = []
        batch: builtins.list[ScheduleFire] = []
        size = 0
        for fire in fires:
            batch.append(fire)
            size += len(fire.tasks) + 1
            if size >= FIRE_CHUNK or len(batch) >= READ_CHUNK:
                created += self._fire(batch, now, overlapped, shard)
                batch, size = [], 0
        if batch:
            created += self._fire(batch, now, overlapped, shard)
        return created

    def _fire(
        self,
        fires: Sequence[ScheduleFire],
        now: dt.datetime,
        overlapped: builtins.list[tuple[str, str, int]] | None,
        shard: int,
    ) -> builtins.list[TaskInfo]:
        args: builtins.list[str] = []
        for fire in fires:
            args += (
                fire.schedule_id,
                micros(fire.expected_next_run_at),
                micros(fire.next_run_at),
                "" if fire.last_run_at is None else micros(fire.last_run_at),
                fire.last_task_id or "",
                overlap_flag(fire.overlap),
                str(len(fire.tasks)),
            )
            for task in fire.tasks:
                args += submit_args(task)
        replies = self._run("schedule_fire", *args, now=now, shard=shard)
        created = []
        for fire, reply in zip(fires, replies, strict=True):
            if overlap_skipped(fire.schedule_id, reply, overlapped):
                continue
            if reply:  # [1, per task 1 (created) or 0]
                created += [
                    new_info(task)
                    for task, was_created in zip(fire.tasks, reply[1:], strict=True)
                    if was_created
                ]
        return created

    @guarded
    def fire_due(
        self,
        now: dt.datetime,
        limit: int,
        *,
        grace: dt.timedelta,
        catch_up_limit: int,
        max_tasks: int,
    ) -> FiringRound:
        """The base round, on the hashes' own strings: an interval is planned in whole
        microseconds (``plan_interval``), and its runs' tasks go to the fire script as the
        schedule stores them (the parameter's JSON text as it is): no ScheduleInfo, NewTask
        or ScheduleFire per run, no JSON decoded and encoded again. Cron schedules take the
        general way (``plan``). The same script as ``fire_schedules`` stores the fires.

        Sharded, the round visits every shard in turn (``fire_due_on``), up to ``limit``
        schedules and ``max_tasks`` tasks on each; ``due`` is the largest of the shards'."""
        rounds = [
            self.fire_due_on(
                shard,
                now,
                limit,
                grace=grace,
                catch_up_limit=catch_up_limit,
                max_tasks=max_tasks,
            )
            for shard in range(len(self.prefixes))
        ]
        if len(rounds) == 1:
            return rounds[0]
        return FiringRound(
            created=[task for r in rounds for task in r.created],
            due=max(r.due for r in rounds),
            skipped=[item for r in rounds for item in r.skipped],
            paused=[item for r in rounds for item in r.paused],
            overlapped=[item for r in rounds for item in r.overlapped],
        )

    @guarded
    def fire_due_on(
        self,
        shard: int,
        now: dt.datetime,
        limit: int,
        *,
        grace: dt.timedelta,
        catch_up_limit: int,
        max_tasks: int,
    ) -> FiringRound:
        """``fire_due`` of the schedules of one shard: its due scan, its fires (one script
        on that shard each, their task ids native to it)."""
        # The round's clock in microseconds, as the interval planning counts: once a round.
        clock = _RoundClock(now, (now - EPOCH) // MICROSECOND, grace, grace // MICROSECOND)
        reply = self._run("schedule_due", limit, *FIRING_FIELDS, now=now, shard=shard)
        due = [
            (text(reply[index]), _present(reply[index + 1])) for index in range(0, len(reply), 2)
        ]
        # A cron schedule is planned from its whole definition (ScheduleInfo): read in full.
        crons = [schedule_id for schedule_id, values in due if "cr" in values]
        prefix = self.prefixes[shard] + "s:"
        full = self._read_many(crons, prefix.__add__) if crons else {}
        fires: builtins.list[_Fire] = []
        skipped: builtins.list[tuple[str, int, str]] = []
        paused: builtins.list[tuple[str, Exception]] = []
        planned = 0
        reported = len(due)
        for schedule_id, values in due:
            if "pa" in values or "nr" not in values or ("cr" in values and schedule_id not in full):
                reported -= 1
                continue
            if planned >= max_tasks:
                reported = limit  # more is due: the next round comes at once
                break
            try:
                runs, next_run, dropped = _plan_runs(
                    schedule_id, values, full, clock, catch_up_limit=catch_up_limit
                )
            except Exception as exc:
                self._pause_on(schedule_id, True, now, shard)
                paused.append((schedule_id, exc))
                continue
            runs, overlapping = overlap_runs(values.get("ov", "allow"), runs)
            planned += len(runs)
            if dropped + overlapping:
                skipped.append((schedule_id, dropped + overlapping, values["m"]))
            fires.append((schedule_id, values, runs, next_run))
        overlapped: builtins.list[tuple[str, str, int]] = []
        created = self._fire_in_chunks(fires, now, str(clock.now_us), overlapped, shard)
        return FiringRound(
            created=created, due=reported, skipped=skipped, paused=paused, overlapped=overlapped
        )

    def _fire_in_chunks(
        self,
        fires: Sequence[_Fire],
        now: dt.datetime,
        created_at: str,
        overlapped: builtins.list[tuple[str, str, int]],
        shard: int,
    ) -> builtins.list[TaskInfo]:
        """``_fire_planned`` over chunks of about FIRE_CHUNK runs (one script call each)."""
        created: builtins.list[TaskInfo] = []
        batch: builtins.list[_Fire] = []
        size = 0
        for fire in fires:
            batch.append(fire)
            size += len(fire[2]) + 1
            if size >= FIRE_CHUNK:
                created += self._fire_planned(batch, now, created_at, overlapped, shard)
                batch, size = [], 0
        if batch:
            created += self._fire_planned(batch, now, created_at, overlapped, shard)
        return created

    def _fire_planned(
        self,
        fires: Sequence[_Fire],
        now: dt.datetime,
        created_at: str,
        overlapped: builtins.list[tuple[str, str, int]],
        shard: int,
    ) -> builtins.list[TaskInfo]:
        """schedule_fire.lua over planned fires: (id, hash fields, runs, next run)."""
        args, ids = _fire_arguments(fires, created_at, shard, self.layout.shards)
        replies = self._run("schedule_fire", *args, now=now, shard=shard)
        created: builtins.list[TaskInfo] = []
        for (schedule_id, values, runs, _), run_ids, reply in zip(fires, ids, replies, strict=True):
            if overlap_skipped(schedule_id, reply, overlapped):
                continue
            if reply and any(reply[1:]):
                created += _created_tasks(values, runs, run_ids, reply[1:], now)
        return created


def _plan_runs(
    schedule_id: str,
    values: dict[str, str],
    full: dict[str, dict[str, str]],
    clock: _RoundClock,
    *,
    catch_up_limit: int,
) -> tuple[list[int], int, int]:
    """(runs, next run, runs dropped) of one due schedule, in microseconds since the epoch:
    an interval by integer arithmetic on its stored strings, a cron from its full hash."""
    every = values.get("ev")
    if every is not None:
        return plan_interval(
            int(values["nr"]),
            int(every),
            int(values["sa"]),
            clock.now_us,
            values["m"],
            grace=clock.grace_us,
            catch_up_limit=catch_up_limit,
        )
    outcome = plan(
        schedule_from_hash(schedule_id, full[schedule_id]),
        clock.now,
        grace=clock.grace,
        catch_up_limit=catch_up_limit,
    )
    runs = [(run - EPOCH) // MICROSECOND for run in outcome.runs]
    return runs, (outcome.next_run_at - EPOCH) // MICROSECOND, outcome.skipped


def _fire_arguments(
    fires: Sequence[_Fire], created_at: str, shard: int, shards: int
) -> tuple[list[str], list[list[str]]]:
    """schedule_fire.lua's arguments for planned fires on ``shard`` of ``shards``, and each
    fire's task ids (native to that shard: sharding.native_id)."""
    now_us = int(created_at)
    args: list[str] = []
    ids: list[list[str]] = []
    for schedule_id, values, runs, next_run in fires:
        if shards == 1:
            run_ids = [fire_task_id_micros(schedule_id, run) for run in runs]
        else:
            run_ids = [
                native_id(fire_task_id_micros(schedule_id, run), shard, shards) for run in runs
            ]
        ids.append(run_ids)
        max_duration = values.get("md", "")
        task = (
            values["n"],
            values["q"],
            values["p"],
            values.get("j", "null"),
            values["rl"],
            values["ri"],
            values["rb"],
            max_duration,
        )
        deadline = str(now_us + int(max_duration) * 1000) if max_duration else ""
        args += (
            schedule_id,
            values["nr"],
            str(next_run),
            str(runs[-1]) if runs else "",
            run_ids[-1] if runs else "",
            overlap_flag(values.get("ov", "allow")),
            str(len(runs)),
        )
        for run, task_id in zip(runs, run_ids, strict=True):
            args.append(task_id)
            args += task
            # No rate key, no trace context (a schedule's run starts a trace of its own), no batch.
            args += (created_at, str(run), deadline, "", "", "")
    return args, ids


def _created_tasks(
    values: dict[str, str],
    runs: list[int],
    run_ids: list[str],
    was_created: Sequence[object],
    now: dt.datetime,
) -> list[TaskInfo]:
    """The TaskInfos of one schedule's runs that the fire script stored (not those whose task
    existed already)."""
    parameter = json.loads(values["j"]) if "j" in values else None
    max_duration_millis = int(values["md"]) if "md" in values else None
    return [
        created_info(
            task_id,
            values["n"],
            values["q"],
            int(values["p"]),
            parameter,
            int(values["rl"]),
            int(values["ri"]),
            values["rb"],
            max_duration_millis,
            now,
            EPOCH + MICROSECOND * run,
        )
        for run, task_id, created in zip(runs, run_ids, was_created, strict=True)
        if created
    ]
