"""Schedules over Redis shards: each on its queue's shard, read merged, moved between shards."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...schedules.records import ScheduleFire
from .access import READ_CHUNK, RedisAccess
from .codec import fields, micros, text
from .sharding import native_id

# Saves schedules of one shard as schedule_save.lua does: (schedules, keep, anchored, shard).
SaveOn = Callable[[Sequence[Any], set[str], set[str], int], None]

# The fields schedule_move_out.lua adds to a hash that is moving away: its next run ("nr"
# until then) and the shard it goes to.
MOVED_NEXT_RUN, MOVED_TO = "mn", "mt"
TIMING = ("ev", "cr", "tz")  # the fields of a schedule's grid, as schedule_save.lua compares them


def copies(
    storage: RedisAccess, schedule_ids: Sequence[str]
) -> dict[str, dict[int, dict[str, str]]]:
    """Every shard's hash of each of these schedules: {id: {shard: fields}} (unknown ids left
    out). One shard holds a schedule, except while a move of it is under way (or stopped
    half-way): then its old shard's hash carries ``mt``."""
    shards = tuple(range(len(storage.prefixes)))
    return read_located(storage, [(schedule_id, shards) for schedule_id in schedule_ids])


def read_located(
    storage: RedisAccess, located: Sequence[tuple[str, Sequence[int]]]
) -> dict[str, dict[int, dict[str, str]]]:
    """The hashes of these schedules on these shards ((id, shards) pairs), as ``copies``: a
    pipeline per chunk of about READ_CHUNK hashes."""
    found: dict[str, dict[int, dict[str, str]]] = {}
    start = 0
    while start < len(located):
        part: list[tuple[str, Sequence[int]]] = []
        size = 0
        while start < len(located) and (not part or size < READ_CHUNK):
            part.append(located[start])
            size += len(located[start][1])
            start += 1
        pipe = storage.client.pipeline(transaction=False)
        for schedule_id, shards in part:
            for shard in shards:
                pipe.hgetall(storage.prefixes[shard] + "s:" + schedule_id)
        replies = iter(pipe.execute())
        for schedule_id, shards in part:
            for shard in shards:
                values = next(replies)
                if values:
                    found.setdefault(schedule_id, {})[shard] = {
                        text(k): text(v) for k, v in values.items()
                    }
    return found


def settled(held: dict[int, dict[str, str]]) -> tuple[int, dict[str, str]]:
    """The copy that is the schedule, and its shard: the one not moving away; else (a move
    stopped before its second step) the one moving away, its next run back under ``nr``."""
    for shard, values in sorted(held.items()):
        if MOVED_TO not in values:
            return shard, values
    shard, values = min(held.items())
    return shard, {**values, "nr": values[MOVED_NEXT_RUN]}


def merged_ids(storage: RedisAccess, index: str) -> Iterator[tuple[str, tuple[int, ...]]]:
    """The ids of index ``index`` (a lexical ZSET of every shard) in order, each once with
    the shards whose index holds it: the shards' indexes read a chunk at a time and merged."""

    def one(shard: int) -> Iterator[tuple[str, int]]:
        key = storage.prefixes[shard] + index
        cursor = 0
        while True:
            ids = storage.client.zrangebylex(key, "-", "+", cursor, READ_CHUNK)
            yield from ((text(i), shard) for i in ids)
            if len(ids) < READ_CHUNK:
                return
            cursor += len(ids)

    merged = heapq.merge(*(one(shard) for shard in range(len(storage.prefixes))))
    for schedule_id, group in itertools.groupby(merged, key=lambda pair: pair[0]):
        yield schedule_id, tuple(shard for _, shard in group)


def save(
    storage: RedisAccess,
    schedules: Sequence[Any],
    keep: set[str],
    anchored: set[str],
    encoded: Callable[[Any], dict[str, str | None]],
    save_on: SaveOn,
) -> None:
    """``save_schedules`` over shards: each schedule saved on the shard its tasks are stored
    on (its queue's, or its limited name's home shard: ``_store_shard``); one stored on another
    shard (its queue or its home changed shard) is moved there (``move``)."""
    held = copies(storage, [info.schedule_id for info in schedules])
    homes = storage.flow_limits.homes()
    in_place: dict[int, list[Any]] = {}
    moves: list[tuple[Any, int, int]] = []
    leftovers: list[tuple[str, int]] = []
    for info in schedules:
        target = storage._store_shard(info.task_name, info.queue, homes)
        found = held.get(info.schedule_id, {})
        source = settled(found)[0] if found else target
        if source == target and MOVED_TO not in found.get(target, {}):
            in_place.setdefault(target, []).append(info)
        else:
            moves.append((info, source, target))
        leftovers += [(info.schedule_id, shard) for shard in found if shard not in (source, target)]
    for shard, infos in sorted(in_place.items()):
        save_on(infos, keep, anchored, shard)
    for info, source, target in moves:
        move(storage, info, source, target, keep, anchored, encoded, save_on)
    # Copies on a third shard: a move that stopped half-way, or two saves that raced with
    # queues of two shards (docs/redis-shards.md). The schedule is now the target's.
    for schedule_id, shard in leftovers:
        storage._run("schedule_delete", schedule_id, shard=shard)


def move(
    storage: RedisAccess,
    info: Any,
    source: int,
    target: int,
    keep: set[str],
    anchored: set[str],
    encoded: Callable[[Any], dict[str, str | None]],
    save_on: SaveOn,
) -> None:
    """Move a schedule from shard ``source`` to shard ``target`` with its new definition, in
    three scripts: schedule_move_out.lua on the source (it stops firing there, atomically with
    reading its state: a run fired before is accounted for in that state, none fires after),
    schedule_move_in.lua on the target (it goes on from that state), schedule_delete.lua on
    the source. Between the first two it fires nowhere, and is read from the source as it was;
    a process stopped there leaves it so until the schedule is written again (saved, paused,
    resumed, deleted), which finishes the move or undoes it (``settle``)."""
    reply = storage._run("schedule_move_out", info.schedule_id, str(target), shard=source)
    values = fields(reply) if reply else {}
    if not values:  # gone meanwhile (deleted, or moved by another process): a plain save
        save_on([info], keep, anchored, target)
        return
    state = moved_in(values, info, keep, anchored, encoded)
    if not int(storage._run("schedule_move_in", info.schedule_id, state, shard=target)):
        save_on([info], keep, anchored, target)  # there already: its state there is newer
    if source != target:
        storage._run("schedule_delete", info.schedule_id, shard=source)


def moved_in(
    values: dict[str, str],
    info: Any,
    keep: set[str],
    anchored: set[str],
    encoded: Callable[[Any], dict[str, str | None]],
) -> str:
    """schedule_move_in.lua's fields (JSON) of a schedule whose stored fields were ``values``
    and whose new definition is ``info``: its state kept as schedule_save.lua keeps it (paused,
    last run and task, overlap counts, created), its next run the stored one if ``keep`` (or
    ``anchored`` with an unchanged grid, which keeps its start as well), else the new one."""
    state = {k: v for k, v in values.items() if k not in ("nr", MOVED_NEXT_RUN, MOVED_TO)}
    next_run = values.get("nr") or values[MOVED_NEXT_RUN]
    definition = encoded(info)
    keep_next = info.schedule_id in keep
    if info.schedule_id in anchored and all(values.get(f) == definition[f] for f in TIMING):
        del definition["sa"]
        keep_next = True
    for field, value in definition.items():
        if value is None:
            state.pop(field, None)
        else:
            state[field] = value
    state["u"] = micros(info.updated_at)
    state["nr"] = next_run if keep_next else micros(info.next_run_at)
    return json.dumps(state)


def settle(storage: RedisAccess, schedule_id: str) -> int | None:
    """The shard of the schedule, after finishing what a move stopped half-way left: a hash
    moved away that has arrived (its target holds it) is deleted; one that has not is made
    the schedule again on its own shard (its definition is the one before the move, whose
    queue is of that shard). None for an unknown id."""
    held = copies(storage, [schedule_id]).get(schedule_id)
    if not held:
        return None
    arrived = [shard for shard, values in held.items() if MOVED_TO not in values]
    if arrived:
        home = min(arrived)
    else:
        home, values = min(held.items())
        restored = {k: v for k, v in values.items() if k not in (MOVED_NEXT_RUN, MOVED_TO)}
        restored["nr"] = values[MOVED_NEXT_RUN]
        storage._run("schedule_move_in", schedule_id, json.dumps(restored), shard=home)
    for shard in held:
        if shard != home:
            storage._run("schedule_delete", schedule_id, shard=shard)
    return home


def native_fire(fire: ScheduleFire, shard: int, shards: int) -> ScheduleFire:
    """A fire whose task ids are native to ``shard`` (sharding.native_id)."""
    tasks = tuple(
        dataclasses.replace(task, task_id=native_id(task.task_id, shard, shards))
        for task in fire.tasks
    )
    last = fire.last_task_id
    return dataclasses.replace(
        fire, tasks=tasks, last_task_id=None if last is None else native_id(last, shard, shards)
    )
