"""Task hashes to records and back: field names, microsecond timestamps, JSON text."""

from __future__ import annotations

import datetime as dt
import json
import operator
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ...core.fairness import fair_key
from ...core.progress import progress_from_json
from ...core.records import Claim, NewTask, StepInfo, TaskInfo
from ...core.serialization import dumps, loads
from ...core.states import TaskStatus
from ...core.waits import EVENT, Wait
from .parameter_index import index_arg

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
MICROSECOND = dt.timedelta(microseconds=1)


def micros(when: dt.datetime) -> str:
    """A datetime as whole microseconds since the epoch, in decimal (exact, unlike floats)."""
    return str((when - EPOCH) // MICROSECOND)


def from_micros(value: Any) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=int(value))


def nonce() -> str:
    """A value unique to one script call: a call redis-py sends again after a lost reply
    carries the same one, so the script can tell "already done by me" from a lost race."""
    return os.urandom(6).hex()


def text(value: Any) -> str:
    """A reply value as str: our own client decodes, a borrowed cache client may not."""
    return value.decode() if isinstance(value, bytes) else str(value)


def key_bucket(name: str, concurrency_key: str) -> str:
    """A task name and concurrency key as key_bucket in lua/_common.lua names the sets of the
    tasks parked by key (the name's length in bytes, as Lua counts, keeps ':' apart)."""
    return f"{len(name.encode())}:{name}:{concurrency_key}"


def fair_set_key(prefix: str, name: str, queue: str, priority: str) -> str:
    """The fair set (fairness="round_robin") of a name, queue and priority under ``prefix``, as
    fair_set in lua/_common.lua names it: its due tasks scored by round."""
    return f"{prefix}fready:{key_bucket(name, queue)}:{priority}"


def fair_member(member: Any) -> tuple[int, str]:
    """(run at in µs, task id) of a fair set's member (fair_member in lua/_common.lua: the run
    at zero-padded to 20 digits, ':', the id)."""
    run_at, _, task_id = text(member).partition(":")
    return int(run_at), task_id


def fields(flat: Sequence[Any]) -> dict[str, str]:
    """HGETALL's flat [field, value, ...] reply as a dict of str."""
    items = [text(item) for item in flat]
    return dict(zip(items[::2], items[1::2], strict=True))


def _when(values: dict[str, str], key: str) -> dt.datetime | None:
    value = values.get(key)
    return from_micros(value) if value else None


def to_info(task_id: str, values: dict[str, str]) -> TaskInfo:
    """A TaskInfo from a task hash's fields (see the key layout in storage/redis/__init__.py)."""
    max_duration = values.get("md")
    result = values.get("o")
    created_at = from_micros(values["c"])
    return TaskInfo(
        task_id=task_id,
        task_name=values["n"],
        status=TaskStatus(values["s"]),
        queue=values["q"],
        priority=int(values["p"]),
        parameter=json.loads(values["j"]),
        attempts=int(values["a"]),
        retry_limit=int(values["rl"]),
        retry_interval=int(values["ri"]),
        retry_backoff=values["rb"],
        max_duration_millis=int(max_duration) if max_duration else None,
        created_at=created_at,
        run_at=_when(values, "r") or created_at,
        started_at=_when(values, "st"),
        finished_at=_when(values, "f"),
        last_error=values.get("e"),
        result=json.loads(result) if result is not None else None,
        worker_id=values.get("w"),
        cancel_requested=values.get("x") == "1",
        progress=progress_from_json(loads(values["pg"])) if "pg" in values else None,
        depends_on=tuple(json.loads(values["dp"])) if "dp" in values else (),
        waiting_for=tuple(json.loads(values["wf"])) if "wf" in values else (),
        trace_context=loads(values["tc"]) if "tc" in values else None,
        # bt: a member's batch, bc: a callback's (counted in no batch).
        batch_id=values.get("bt") or values.get("bc"),
        # hr: terminal while the handler of its last attempt runs on (expire.lua).
        handler_running=values["s"] == "RUNNING" or "hr" in values,
        attempt_timeout=float(values["at"]) if "at" in values else None,
        # wt: a PENDING task's durable wait (suspend.lua; left behind once it runs again).
        waiting=unpacked_wait(values["wt"])
        if "wt" in values and values["s"] == "PENDING"
        else None,
        resumptions=int(values.get("rs", 0)),
        concurrency_key=values.get("ck"),
        rate_key=values.get("rk"),
        tags=tuple(json.loads(values["tg"])) if "tg" in values else (),
    )


def packed_wait(wait: Wait) -> str:
    """A durable wait as the task hash's ``wt`` keeps it: a short JSON list ``[kind, name,
    until in µs or null, awaited ids]``. Short, so that the hash stays in Redis's compact
    encoding (every value under hash-max-listpack-value, 64 bytes by default): the whole
    TaskInfo.waiting object there would make every waiting task's hash several times larger."""
    until = None if wait.until is None else int(micros(wait.until))
    return json.dumps([wait.kind, wait.name, until, list(wait.task_ids)], separators=(",", ":"))


def unpacked_wait(text_value: str) -> dict[str, Any]:
    """``TaskInfo.waiting`` from a ``wt`` field (packed_wait)."""
    kind, name, until, task_ids = json.loads(text_value)
    return Wait(
        kind,
        name,
        until=None if until is None else from_micros(until),
        event=name if kind == EVENT else None,
        task_ids=tuple(task_ids),
    ).describe()


def stored_steps(values: Mapping[Any, Any]) -> list[tuple[str, str, str]]:
    """A steps hash (HGETALL) as ``(name, finished at in µs, result JSON)`` in the order the
    steps finished."""
    entries = []
    for field, value in values.items():
        order, finished, result = text(value).split(" ", 2)
        entries.append((int(order), text(field), finished, result))
    entries.sort()
    return [(name, finished, result) for _, name, finished, result in entries]


def step_infos(values: Mapping[Any, Any]) -> tuple[StepInfo, ...]:
    """``TaskInfo.steps`` of a steps hash."""
    return tuple(StepInfo(name, from_micros(at)) for name, at, _ in stored_steps(values))


def to_claim(task_id: str, values: dict[str, str]) -> Claim:
    return Claim(
        task=to_info(task_id, values),
        token=int(values["k"]),
        budget_attempts=int(values["b"]),
        deadline_at=_when(values, "d"),
    )


# What claim.lua returns for each claimed task, in this order (a waiting task has no start,
# finish, result or cancel request yet).
CLAIMED_FIELDS = "n q p s j a b rl ri rb md c r d e w k tc at rs ck rk tg".split()  # noqa: SIM905


# Which of CLAIMED_FIELDS are read as text, which as integers.
# n q s j rb md c r d e w tc at
_TEXTS = operator.itemgetter(0, 1, 3, 4, 9, 10, 11, 12, 13, 14, 15, 17, 18)
_INTEGERS = operator.itemgetter(2, 5, 6, 7, 8, 16)  # p a b rl ri k
_DELTA = dt.timedelta  # (days, seconds, microseconds)
_STATUSES = {status.value: status for status in TaskStatus}  # TaskStatus(s), without enum's call


def claimed(task_id: str, values: Sequence[Any], now: dt.datetime, shard: int = 0) -> Claim:
    """A Claim from claim.lua's values (the hot path: no dict, no decoding when not bytes, the
    records built without their __init__, no call per timestamp); RUNNING when the claim
    started it, at ``now``; claimed on ``shard``."""
    if values and isinstance(values[0], bytes):
        values = [None if v is None else v.decode() for v in values]
    n, q, s, j, rb, md, c, r, d, e, w, tc, at = _TEXTS(values)
    rs = values[19]  # resumptions: absent (None) until the first
    ck = values[20]  # concurrency_key: absent (None) for none
    rk = values[21]  # rate_key: absent (None) for none
    tg = values[22]  # tags: a JSON list, absent (None) for none
    p, a, b, rl, ri, k = map(int, _INTEGERS(values))  # in C, not a call per field
    created_at = EPOCH + _DELTA(0, 0, int(c))
    status = _STATUSES.get(s) or TaskStatus(s)
    info = object.__new__(TaskInfo)
    info.__dict__.update(
        {
            "task_id": task_id,
            "task_name": n,
            "status": status,
            "queue": q,
            "priority": p,
            "parameter": loads(j),
            "attempts": a,
            "retry_limit": rl,
            "retry_interval": ri,
            "retry_backoff": rb,
            "max_duration_millis": int(md) if md else None,
            "created_at": created_at,
            "run_at": EPOCH + _DELTA(0, 0, int(r)) if r and r != c else created_at,
            # Started by the claim: at now, or at its creation if it was submitted after now
            # was read (as claim.lua records it).
            "started_at": max(now, created_at) if status is TaskStatus.RUNNING else None,
            "finished_at": None,
            "last_error": e,
            "result": None,
            "worker_id": w,
            "cancel_requested": False,
            "progress": None,  # not read by the claim: a worker has no use for it
            "trace_context": loads(tc) if tc else None,
            "batch_id": None,  # neither is this (context.batch_id reads the task)
            "handler_running": status is TaskStatus.RUNNING,
            "attempt_timeout": float(at) if at else None,
            "steps": (),
            "waiting": None,  # not read by the claim: cleared once the task runs
            "resumptions": int(rs) if rs else 0,
            "concurrency_key": ck or None,
            "rate_key": rk or None,
            "tags": tuple(json.loads(tg)) if tg else (),
        }
    )
    claim = object.__new__(Claim)
    claim.__dict__.update(
        task=info,
        token=k,
        budget_attempts=b,
        deadline_at=EPOCH + _DELTA(0, 0, int(d)) if d else None,
        shard=shard,
    )
    return claim


def submit_args(task: NewTask, fair: Collection[str] = frozenset()) -> list[str]:
    """The 21 values (TASK_ARGS) submit.lua takes per task; ``fair``: the names with fairness
    (flow_limits.fair()), whose tasks store_task numbers a round under their fair key."""
    return [
        task.task_id,
        task.task_name,
        task.queue,
        str(task.priority),
        dumps(task.parameter),
        str(task.retry_limit),
        str(task.retry_interval),
        task.retry_backoff,
        "" if task.max_duration_millis is None else str(task.max_duration_millis),
        micros(task.created_at),
        micros(task.run_at),
        "" if task.deadline_at is None else micros(task.deadline_at),
        task.rate_key or "",
        "" if task.trace_context is None else dumps(task.trace_context),
        task.batch_id or "",
        task.batch_generation or "",
        # repr: the shortest text that reads back as the same float
        "" if task.attempt_timeout is None else repr(float(task.attempt_timeout)),
        task.concurrency_key or "",
        fair_arg(task.task_name, task.concurrency_key, task.rate_key, fair),
        # the tags as a JSON list ('' for none): the hash's tg, each in its tag's set
        json.dumps(list(task.tags), separators=(",", ":")) if task.tags else "",
        # its parameter index entries ('' for none): the hash's px, each in its entry's set
        index_arg(task.indexed),
    ]


def fair_arg(
    name: str, concurrency_key: str | None, rate_key: str | None, fair: Collection[str]
) -> str:
    """A task's last TASK_ARGS value: ':' and the key it takes turns under (core/fairness.py)
    for a name with fairness, '' for any other ('' alone could not tell a fair task of the
    keyless tasks' key "" from a task without fairness)."""
    return ":" + fair_key(concurrency_key, rate_key) if name in fair else ""
