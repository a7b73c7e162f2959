"""Sharded Redis submits: the unique keys and task ids reserved on their home shards."""

from __future__ import annotations

import random
import time
from collections.abc import Collection, Sequence
from typing import Any

from ...core.records import NewTask, TaskInfo
from ...core.states import LIVE_STATUSES
from ...exceptions import TaskSubmitError
from .access import RedisAccess
from .codec import from_micros, micros, text, to_info
from .debouncing import join_entry, may_join
from .sharding import directory_of, unique_home

# Sharded: how long a task id reserved for a shard that has not stored it (its submitter is
# on its way there, or crashed) stays reserved before a submit to another shard may take it.
ID_RESERVATION_GRACE_SECONDS = 300
# Sharded: how long a unique key reserved on its home shard for a task that is not stored yet
# (its submitter is one round trip from storing it, or crashed) makes a submit of the same key
# wait for that task before taking the key over. A submit waits instead of failing, so this is
# short: a live submitter stores the task within milliseconds of reserving the key.
UNIQUE_RESERVATION_GRACE_SECONDS = 10
UNIQUE_POLL_SECONDS = 0.005


def reserve_keys(storage: RedisAccess, tasks: Sequence[NewTask], shard_of: Any) -> dict[str, int]:
    """Sharded, a call of several runs: unique_reserve.lua (holding the key even on its
    task's own shard) for each task with a unique key whose id is not stored, the first
    of the call for each key; the ids whose key this call now holds -> their key's home.
    A key a live task holds is not taken (its task is not stored: Submitting._check_dependencies).
    A key reserved for a task of another submit not stored yet is not waited for while
    this call holds others (two calls could each wait for the other's key): every key is
    given back and the whole reservation tried again a moment later."""
    candidates = [t for t in tasks if t.unique_key is not None and t.unique_until is not None]
    if not candidates:
        return {}
    stored = set(storage.get_many(sorted({t.task_id for t in candidates})))
    started = time.monotonic()
    while True:
        patient = time.monotonic() - started >= UNIQUE_RESERVATION_GRACE_SECONDS
        reserved: dict[str, int] = {}
        seen: set[str] = set()
        busy = False
        try:
            for task in candidates:
                assert task.unique_key is not None
                if task.task_id in stored or task.unique_key in seen:
                    continue
                seen.add(task.unique_key)
                home = unique_home(task.unique_key, storage.layout.shards)
                if patient:  # long past any live submitter's store: wait as one run does
                    holder = take_unique(storage, task, home, shard_of(task), hold=True)
                    taken = holder is None
                else:
                    holder, taken = hold_unique(storage, task, home, shard_of(task))
                if taken:
                    reserved[task.task_id] = home
                elif holder is None:
                    busy = True
                    break
        except BaseException:
            release_keys(storage, tasks, reserved, shard_of)
            raise
        if not busy:
            return reserved
        release_keys(storage, tasks, reserved, shard_of)
        time.sleep(UNIQUE_POLL_SECONDS * (1 + random.random()))


def hold_unique(
    storage: RedisAccess, task: NewTask, home: int, shard: int
) -> tuple[TaskInfo | None, bool]:
    """unique_reserve.lua on ``home`` holding ``task``'s key for its ``shard``, without
    waiting: (None, True) once taken, (the live task that holds it, False), or (None,
    False) while it is reserved for a task of another submit not stored yet. A debounced
    ``task`` takes the key from a task it may not join (may_join), and joins none here: the
    call may yet be refused whole."""
    assert task.unique_key is not None and task.unique_until is not None
    until = micros(task.unique_until)
    expected = ""
    while True:
        reply = storage._run(
            "unique_reserve",
            shard,
            task.unique_key,
            task.task_id,
            until,
            expected,
            "1",
            shard=home,
        )
        if not text(reply):
            return None, True
        holder, settled = entry_holder(storage, text(reply), home, None)
        if holder is not None and task.debounce is not None and not may_join(holder):
            holder = None  # claimed or started: a debounced submit opens a new window
        if holder is not None or not settled:
            return holder, False
        expected = text(reply)  # take it over, unless it changed since it was read


def release_keys(
    storage: RedisAccess, tasks: Sequence[NewTask], reserved: Collection[str], shard_of: Any
) -> None:
    """Give back the keys of ``reserved`` ids (see reserve_keys) whose task is not
    stored."""
    for task in tasks:
        if task.task_id not in reserved:
            continue
        assert task.unique_key is not None
        shard = shard_of(task)
        if not storage.client.exists(storage._tkey(task.task_id, shard)):
            home = unique_home(task.unique_key, storage.layout.shards)
            storage._run("unique_release", shard, task.unique_key, task.task_id, shard=home)


def take_unique(
    storage: RedisAccess, task: NewTask, home: int, shard: int, hold: bool = False
) -> TaskInfo | None:
    """unique_reserve.lua on ``home``, the home shard of ``task``'s unique key, for the
    task's queue's ``shard``: None once taken (on ``home`` for ``shard``; deleted when
    ``home`` is ``shard`` and not ``hold``, for submit.lua to take), or the live task that
    holds it; for a debounced ``task``, the task it joined (debouncing.join_entry; with
    ``hold``, as hold_unique, the task it may join), the key taken from one it may not join."""
    assert task.unique_key is not None and task.unique_until is not None
    until = micros(task.unique_until)
    expected = ""
    started = time.monotonic()
    while True:
        reply = storage._run(
            "unique_reserve",
            shard,
            task.unique_key,
            task.task_id,
            until,
            expected,
            "1" if hold else "",
            shard=home,
        )
        if not text(reply):
            return None
        holder, _settled = entry_holder(storage, text(reply), home, started)  # waits: settled
        if holder is not None and task.debounce is not None:
            if not hold:
                holder = join_entry(storage, task, text(reply), home)
            elif not may_join(holder):
                holder = None  # as hold_unique: the join waits for the call's own writes
        if holder is not None:
            return holder
        expected = text(reply)  # take it over, unless it changed since it was read


def entry_holder(
    storage: RedisAccess, entry: str, home: int, started: float | None
) -> tuple[TaskInfo | None, bool]:
    """The live task a unique key's ``entry`` (on ``home``) names, and whether that is
    settled. A reserved task not stored yet is waited for (``started``: when the waiting
    began, monotonic) until it is stored or the reservation is older than the grace; with
    ``started`` None it is not waited for: (None, False)."""
    parts = entry.split(" ")
    task_id = parts[1]
    where = home if len(parts) == 2 else int(parts[2])
    while True:
        values = storage.client.hgetall(storage._tkey(task_id, where))
        if values:
            info = to_info(task_id, {text(k): text(v) for k, v in values.items()})
            # Not ended: live, or its timed-out handler still runs (docs/guarantees.md).
            ended = info.status not in LIVE_STATUSES and not info.handler_running
            return (None if ended else info), True
        if len(parts) == 2:
            return None, True  # its holder was purged
        age = (storage.clock.now() - from_micros(parts[3])).total_seconds()
        if age >= UNIQUE_RESERVATION_GRACE_SECONDS:
            return None, True  # its submitter died between reserving and storing
        if started is None:
            return None, False
        if time.monotonic() - started >= UNIQUE_RESERVATION_GRACE_SECONDS:
            return None, True
        time.sleep(UNIQUE_POLL_SECONDS)


def reserve_ids(
    storage: RedisAccess, tasks: Sequence[NewTask], shard: int, own: set[str] | None = None
) -> dict[int, tuple[TaskInfo, bool]]:
    """id_reserve.lua on the directory shard of each id not of this shard (positions by
    directory), and of this shard too for the ids of ``own`` (submit.lua drops that entry
    when it stores the task); the existing task of each id another shard holds, by
    position."""
    foreign: dict[int, list[int]] = {}
    for index, task in enumerate(tasks):
        directory = directory_of(task.task_id, storage.layout.shards)
        if directory != shard or (own is not None and task.task_id in own):
            foreign.setdefault(directory, []).append(index)
    held: dict[int, tuple[TaskInfo, bool]] = {}
    for directory, positions in sorted(foreign.items()):
        args = [value for p in positions for value in (tasks[p].task_id, "")]
        replies = storage._run("id_reserve", shard, *args, shard=directory)
        for position, reply in zip(positions, replies, strict=True):
            if text(reply):
                existing = held_elsewhere(storage, tasks[position], directory, text(reply), shard)
                if existing is not None:
                    held[position] = (existing, False)
    return held


def held_elsewhere(
    storage: RedisAccess, task: NewTask, directory: int, entry: str, shard: int
) -> TaskInfo | None:
    """The task of ``task``'s id that another shard holds (``entry``: id_reserve's reply),
    or None once the id is reserved for this shard after all: its reservation named a
    shard that never stored it, and is older than the grace."""
    home = directory if entry == "here" else int(entry.split(" ", 1)[0])
    values = storage.client.hgetall(storage._tkey(task.task_id, home))
    if values:
        return to_info(task.task_id, {text(k): text(v) for k, v in values.items()})
    if entry != "here":
        reserved_at = from_micros(entry.split(" ", 1)[1])
        age = (storage.clock.now() - reserved_at).total_seconds()
        if age < ID_RESERVATION_GRACE_SECONDS:
            raise TaskSubmitError(
                f"task_id {task.task_id!r} is being submitted to a queue of shard {home} "
                f"(reserved {age:.0f} s ago); submit it to that shard's queue, or again "
                f"after {ID_RESERVATION_GRACE_SECONDS} s",
                field="task_id",
            )
    # A reservation past its grace (or a task purged meanwhile): take it over, unless it
    # changed since it was read.
    expected = "" if entry == "here" else entry
    reply = storage._run("id_reserve", shard, task.task_id, expected, shard=directory)
    if text(reply[0]):
        raise TaskSubmitError(
            f"task_id {task.task_id!r} is being submitted to another shard's queue",
            field="task_id",
        )
    return None


def take_foreign_keys(
    storage: RedisAccess,
    tasks: Sequence[NewTask],
    shard: int,
    held: dict[int, tuple[TaskInfo, bool]],
    reserved: set[str] | None,
) -> tuple[set[str], dict[int, int]]:
    """Sharded, before ``tasks`` are stored on ``shard`` (``held``: reserve_ids's answer,
    completed here): the unique key of each task whose home is another shard taken there. The
    ids to store without their key (taken on its home, or by the call: ``reserved``), and
    the positions whose key an earlier position of the call took -> that position."""
    existing_ids(storage, tasks, shard, held, reserved)
    # Unique keys whose home is another shard are taken there first: a key a live task
    # holds returns that task; a key taken is not taken again on this shard.
    keyless: set[str] = set()
    released: list[str] = []
    taken: dict[str, int] = {}  # key digest -> the position that took it in this call
    same: dict[int, int] = {}  # position -> the earlier one of its key: its task
    for index, task in enumerate(tasks):
        if index in held or task.unique_key is None or task.unique_until is None:
            continue
        if reserved and task.task_id in reserved and task.unique_key not in taken:
            keyless.add(task.task_id)
            taken[task.unique_key] = index
            continue
        home = unique_home(task.unique_key, storage.layout.shards)
        if home == shard:
            continue
        if task.unique_key in taken:
            same[index] = taken[task.unique_key]
            holder = None
        else:
            holder = take_unique(storage, task, home, shard)
            if holder is None:
                keyless.add(task.task_id)
                taken[task.unique_key] = index
                continue
        if holder is not None:
            held[index] = (holder, False)
        if directory_of(task.task_id, storage.layout.shards) != shard:
            released.append(task.task_id)
    if released:  # ids reserved above for tasks not stored after all
        by_directory: dict[int, list[str]] = {}
        for task_id in released:
            by_directory.setdefault(directory_of(task_id, storage.layout.shards), []).append(
                task_id
            )
        for directory, ids in sorted(by_directory.items()):
            storage._run("id_release", shard, *ids, shard=directory)
    return keyless, same


def existing_ids(
    storage: RedisAccess,
    tasks: Sequence[NewTask],
    shard: int,
    held: dict[int, tuple[TaskInfo, bool]],
    reserved: set[str] | None,
) -> None:
    """Sharded, before take_foreign_keys takes the unique keys of ``tasks`` on their homes:
    each task with a key whose home is another shard and whose id is stored already, on
    ``shard`` or on the shard its directory entry on ``shard`` names, added to ``held`` as
    that task, unchanged. submit.lua looks at the id before the key (as the databases do): a
    submit naming an existing id is answered with that task whatever its key, which it does
    not take. Without this, the key's home would answer with the key's holder, or take the
    key for a task never stored (id_reserve.lua answers '' for an id stored on this shard off
    its directory, the same as for a new one). One pipelined read on ``shard``, only for
    such tasks; ``reserved`` ids (reserve_keys) are known not to be stored."""
    wanted = [
        index
        for index, task in enumerate(tasks)
        if index not in held
        and task.unique_key is not None
        and task.unique_until is not None
        and not (reserved and task.task_id in reserved)
        and unique_home(task.unique_key, storage.layout.shards) != shard
    ]
    if not wanted:
        return
    pipe = storage.client.pipeline(transaction=False)
    for index in wanted:
        task_id = tasks[index].task_id
        pipe.hgetall(storage._tkey(task_id, shard))
        pipe.get(storage.prefixes[shard] + "i:" + task_id)
    replies = pipe.execute()
    elsewhere: dict[int, int] = {}  # position -> the other shard its directory entry names
    for index, values, entry in zip(wanted, replies[::2], replies[1::2], strict=True):
        task_id = tasks[index].task_id
        if values:
            held[index] = (to_info(task_id, {text(k): text(v) for k, v in values.items()}), False)
        elif entry is not None and directory_of(task_id, storage.layout.shards) == shard:
            other = int(text(entry).split(" ", 1)[0])
            if other != shard:
                elsewhere[index] = other
    if not elsewhere:
        return
    pipe = storage.client.pipeline(transaction=False)
    for index, other in elsewhere.items():
        pipe.hgetall(storage._tkey(tasks[index].task_id, other))
    for index, values in zip(elsewhere, pipe.execute(), strict=True):
        if values:
            info = to_info(tasks[index].task_id, {text(k): text(v) for k, v in values.items()})
            held[index] = (info, False)
