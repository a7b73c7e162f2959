"""The master's firing of schedules in the Redis storage: due scan, planning, one script a fire."""

from __future__ import annotations

import builtins
import datetime as dt
import json
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from ...core.ids import fire_task_id_micros
from ...core.parameter_index import index_entries, with_entries
from ...core.records import TaskInfo, created_info, new_info
from ...schedules.planning import overlap_runs, plan, plan_interval
from ...schedules.records import FiringRound, ScheduleFire
from . import schedule_moves
from .access import READ_CHUNK, RedisAccess, guarded
from .codec import EPOCH, MICROSECOND, fair_arg, micros, submit_args, text
from .parameter_index import index_arg, searchable_keys
from .schedule_overlap import overlap_flag, overlap_skipped
from .schedules import schedule_from_hash
from .sharding import CONTROL_SHARD, native_id

# A planned fire on the hashes' strings: schedule id, its hash fields, its runs and its next run
# (microseconds).
_Fire = tuple[str, dict[str, str], list[int], int]
_T = TypeVar("_T")


class _RoundClock(NamedTuple):
    """A firing round's now and misfire grace, also in whole microseconds (computed once a
    round, not once a schedule)."""

    now: dt.datetime
    now_us: int
    grace: dt.timedelta
    grace_us: int


FIRE_CHUNK = 500  # tasks (and schedules) per fire script call, as SUBMIT_CHUNK for submits

# The fields the master's round reads of each due schedule: to plan it (a cron one is then read
# in full) and to fire it.
FIRING_FIELDS = (
    *("nr", "ev", "sa", "m", "pa", "cr", "n", "q", "p", "j", "rl", "ri", "rb", "md"),
    "ov",
)


def _chunks(
    items: Sequence[_T], runs: Callable[[_T], int], most: int | None = None
) -> Iterator[list[_T]]:
    """``items`` in order, in chunks of about FIRE_CHUNK ``runs`` (a chunk closes once it
    reaches that), each of at most ``most`` items."""
    batch: list[_T] = []
    size = 0
    for item in items:
        batch.append(item)
        size += runs(item)
        if size >= FIRE_CHUNK or (most is not None and len(batch) >= most):
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _present(values: Sequence[Any]) -> dict[str, str]:
    """schedule_due.lua's FIRING_FIELDS values as a dict of the fields present."""
    if values and isinstance(values[0], bytes):  # nr: every schedule has one
        values = [None if value is None else text(value) for value in values]
    return {
        field: value
        for field, value in zip(FIRING_FIELDS, values, strict=True)
        if value is not None
    }


class ScheduleFires(RedisAccess):
    """Firing due schedules: ``fire_due`` (the master's round, on the hashes' own strings) and
    ``fire_schedules`` (fires planned elsewhere), each fire one schedule_fire.lua step on the
    schedule's shard."""

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

        Sharded, a fire goes to the shard of its tasks' queue, or of a limited name's home
        (where its schedule lives; one that moved away meanwhile finds nothing to fire there),
        its task ids made native to that shard (sharding.native_id)."""
        by_shard = self._fires_by_shard(fires) if self.sharded else {CONTROL_SHARD: fires}
        created: builtins.list[TaskInfo] = []
        for shard, part in sorted(by_shard.items()):
            for batch in _chunks(part, lambda fire: len(fire.tasks) + 1, READ_CHUNK):
                created += self._fire(batch, now, overlapped, shard)
        return created

    def _fires_by_shard(
        self, fires: Sequence[ScheduleFire]
    ) -> dict[int, builtins.list[ScheduleFire]]:
        """The fires by the shard they go to, each made native to it (a fire of a schedule
        no longer stored left out)."""
        shards = self.layout.shards
        homes = self.flow_limits.homes()
        # A schedule lives on the shard its tasks are stored on (_store_shard); one of a
        # limited name whose home shard is not its queue's is looked up, as one without tasks
        # is: saved before its name was limited, it is still on its queue's shard.
        looked_up = {
            f.schedule_id
            for f in fires
            if not f.tasks
            or self._store_shard(f.tasks[0].task_name, f.tasks[0].queue, homes)
            != self.layout.shard_of(f.tasks[0].queue)
        }
        located = self._schedule_shards(sorted(looked_up))
        by_shard: dict[int, builtins.list[ScheduleFire]] = {}
        for fire in fires:
            if fire.tasks and fire.schedule_id not in looked_up:
                shard = self.layout.shard_of(fire.tasks[0].queue)
            elif fire.schedule_id in located:
                shard = located[fire.schedule_id]
            else:
                continue  # no such schedule any more: nothing to fire
            by_shard.setdefault(shard, []).append(schedule_moves.native_fire(fire, shard, shards))
        return by_shard

    def _schedule_shards(self, schedule_ids: Sequence[str]) -> dict[str, int]:
        """The shard of each of these schedules that is not moving away (unknown ids left out)."""
        held = schedule_moves.copies(self, schedule_ids) if schedule_ids else {}
        return {i: schedule_moves.settled(copies)[0] for i, copies in held.items()}

    def _fire(
        self,
        fires: Sequence[ScheduleFire],
        now: dt.datetime,
        overlapped: builtins.list[tuple[str, str, int]] | None,
        shard: int,
    ) -> builtins.list[TaskInfo]:
        """schedule_fire.lua over fires of one shard."""
        args: builtins.list[str] = []
        fair = self.flow_limits.fair()
        keys = searchable_keys()
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
                args += submit_args(with_entries(task, keys), fair)
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
                self._run("schedule_pause", schedule_id, "1", now=now, shard=shard)
                paused.append((schedule_id, exc))
                continue
            runs, overlapping = overlap_runs(values.get("ov", "allow"), runs)
            planned += len(runs)
            if dropped + overlapping:
                skipped.append((schedule_id, dropped + overlapping, values["m"]))
            fires.append((schedule_id, values, runs, next_run))
        overlapped: builtins.list[tuple[str, str, int]] = []
        created: builtins.list[TaskInfo] = []
        created_at = str(clock.now_us)
        for batch in _chunks(fires, lambda fire: len(fire[2]) + 1):
            created += self._fire_planned(batch, now, created_at, overlapped, shard)
        return FiringRound(
            created=created, due=reported, skipped=skipped, paused=paused, overlapped=overlapped
        )

    def _fire_planned(
        self,
        fires: Sequence[_Fire],
        now: dt.datetime,
        created_at: str,
        overlapped: builtins.list[tuple[str, str, int]],
        shard: int,
    ) -> builtins.list[TaskInfo]:
        """schedule_fire.lua over planned fires: (id, hash fields, runs, next run)."""
        fair = self.flow_limits.fair()
        args, ids = _fire_arguments(
            fires, created_at, shard, self.layout.shards, fair, searchable_keys()
        )
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
    fires: Sequence[_Fire],
    created_at: str,
    shard: int,
    shards: int,
    fair: Collection[str],
    searchable: Collection[str],
) -> tuple[list[str], list[list[str]]]:
    """schedule_fire.lua's arguments for planned fires on ``shard`` of ``shards``, and each
    fire's task ids (native to that shard: sharding.native_id); ``fair``: the names with
    fairness; ``searchable``: the parameter keys indexed (SEARCHABLE_PARAMETERS)."""
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
        fair_value = fair_arg(values["n"], None, None, fair)  # keyless: the key ""
        # Its runs' parameter index entries: the schedule's parameter's, the same for each.
        entries = (
            index_arg(index_entries(json.loads(values.get("j", "null")), searchable))
            if searchable
            else ""
        )
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
            # No rate key, no trace context (a schedule's run starts a trace of its own), no
            # batch (nor its generation), no attempt timeout of its own (its handler's
            # applies), no concurrency key, no tags: the TASK_ARGS values of submit_args.
            args += (created_at, str(run), deadline, "", "", "", "", "", "", fair_value, "")
            args.append(entries)
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
