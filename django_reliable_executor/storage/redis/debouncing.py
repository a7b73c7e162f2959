"""Debounced submits on the Redis storage: what submit.lua takes for them, and, sharded, the join
of a task stored on another shard than its key's home (debounce_join.lua)."""

from __future__ import annotations

import datetime as dt

from ...core.records import NewTask, TaskInfo, copy_with
from ...core.serialization import dumps
from ...core.states import TaskStatus
from .access import RedisAccess
from .codec import MICROSECOND, fields, micros, text, to_info
from .parameter_index import index_arg


def debounce_args(task: NewTask) -> tuple[str, str]:
    """submit.lua's last 2 values per task: its debounce and debounce_max_wait in µs ('' = not
    debounced; no longest wait)."""
    if task.debounce is None:
        return ("", "")
    longest = task.debounce_max_wait
    return (_micros(task.debounce), "" if longest is None else _micros(longest))


def _micros(seconds: float) -> str:
    # Rounded as debounced_run_at's timedelta rounds them (the database storage's join).
    return str(dt.timedelta(seconds=seconds) // MICROSECOND)


def may_join(info: TaskInfo) -> bool:
    """Whether a debounced submit may join task ``info`` as it was read: a hint only, the join
    (submit.lua, debounce_join.lua) decides atomically."""
    return info.status is TaskStatus.CREATED and not info.attempts and info.worker_id is None


def join_entry(storage: RedisAccess, task: NewTask, entry: str, home: int) -> TaskInfo | None:
    """Debounced ``task`` joins the task its key's ``entry`` (unique_reserve.lua's reply, on the
    key's ``home`` shard) names: join_on that task's shard."""
    parts = entry.split(" ")
    return join_on(storage, task, parts[1], home if len(parts) == 2 else int(parts[2]), home)


def join_on(
    storage: RedisAccess, task: NewTask, holder_id: str, where: int, home: int
) -> TaskInfo | None:
    """debounce_join.lua on ``where``: debounced ``task`` joins task ``holder_id`` stored there,
    whose key then holds longer on its ``home`` shard (in the same call when that is
    ``where``). The joined task (``debounced`` set), or None when it may not be joined (the
    submit then takes the key for ``task``)."""
    assert task.unique_key is not None and task.unique_until is not None
    # (KEY_HOLD, as the service set it: the key's window end past the task's run at)
    hold = int(micros(task.unique_until)) - int(micros(task.run_at))
    reply = storage._run(
        "debounce_join",
        holder_id,
        dumps(task.parameter),
        micros(task.created_at),
        *debounce_args(task),
        str(hold),
        task.unique_key if where == home else "",
        index_arg(task.indexed),
        shard=where,
    )
    if not isinstance(reply, list):
        return None
    until, values = reply
    if where != home:
        # The entry taken again for its task with the later window end, unless it names
        # another task by now (the key passed to a new window meanwhile: that one holds).
        storage._run(
            "unique_reserve", where, task.unique_key, holder_id, text(until), "", "1", shard=home
        )
    return copy_with(to_info(holder_id, fields(values)), debounced=True)
