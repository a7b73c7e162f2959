"""Helpers of the Redis script tests: snapshots of a key prefix, the index invariant checker,
and shortcuts that drive a task into a given state."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.core.records import Claim, TaskInfo
from django_reliable_executor.core.states import TERMINAL_STATUSES, WAITING_STATUSES, TaskStatus
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.codec import key_bucket, micros, text

LEASE = 30.0  # seconds
WORKER_A = "worker-a"
WORKER_B = "worker-b"
WAITING = {status.value for status in WAITING_STATUSES}
TERMINAL = {status.value for status in TERMINAL_STATUSES}

NONCE = "test-nonce"  # the per-call nonce of start, complete and fail called directly
Snapshot = dict[str, tuple[str, Any]]
# Keys with no task index in them, as (name, type).
KNOWN_KEYS = {
    ("counts", "hash"),
    ("queues", "set"),
    ("workers", "hash"),
    ("workers:seen", "zset"),
    ("held", "hash"),
    ("parked", "set"),
    ("kparked", "set"),  # names with tasks parked by key: checked by key_cap_problems
    ("queues:paused", "set"),
    ("outbox:seq", "string"),
    ("layout", "string"),  # REDIS_SHARDS recorded under the key prefix (layout.py)
}


# -- reading Redis as it is -----------------------------------------------------------------
def snapshot(storage: RedisStorage, shard: int = 0) -> Snapshot:
    """Every key of the storage's prefix (of ``shard``), named without the prefix, as (type,
    contents)."""
    client, p = storage.client, storage.prefixes[shard]
    # The server is shared and may hold many other keys: few, long SCAN steps.
    keys = sorted(client.scan_iter(match=p + "*", count=10_000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    kinds = pipe.execute()
    pipe = client.pipeline(transaction=False)
    for key, kind in zip(keys, kinds, strict=True):
        if kind == "hash":
            pipe.hgetall(key)
        elif kind == "list":
            pipe.lrange(key, 0, -1)
        elif kind == "zset":  # scores as Redis prints them: exact, unlike floats
            pipe.zrange(key, 0, -1, withscores=True, score_cast_func=text)
        elif kind == "set":
            pipe.smembers(key)
        elif kind == "string":
            pipe.get(key)
        else:
            raise AssertionError(f"{key} has a type no script writes: {kind}")
    values = pipe.execute()
    return {
        key[len(p) :]: (kind, sorted(value) if kind == "set" else value)
        for key, kind, value in zip(keys, kinds, values, strict=True)
    }


def changed_keys(before: Snapshot, after: Snapshot) -> set[str]:
    return {key for key in before.keys() | after.keys() if before.get(key) != after.get(key)}


@contextlib.contextmanager
def unchanged(storage: RedisStorage) -> Iterator[None]:
    """Asserts that the block leaves every key of the prefix exactly as it found it."""
    before = snapshot(storage)
    yield
    assert snapshot(storage) == before


def index_problems(storage: RedisStorage, snap: Snapshot | None = None) -> list[str]:
    """Everything wrong with the prefix's indexes, one line each (the storage module docstring
    states the invariants): every task is in exactly the one index its status allows, index
    scores match the hash fields, and the counts hash equals the statuses actually stored.
    Sharded (and no ``snap`` given): each shard's, and the batches (on shard 0) against the
    members of every shard; no message is left undelivered in any outbox."""
    if snap is not None or not storage.sharded:
        snap = snapshot(storage) if snap is None else snap
        problems, tasks = _shard_problems(snap)
        return problems + batch_problems(snap, tasks)
    problems, tasks = [], {}
    snaps = [snapshot(storage, shard) for shard in range(len(storage.prefixes))]
    for shard, snap in enumerate(snaps):
        found, shard_tasks = _shard_problems(snap)
        problems += [f"shard {shard}: {problem}" for problem in found]
        tasks.update(shard_tasks)
    return problems + batch_problems(snaps[0], tasks)


def _shard_problems(snap: Snapshot) -> tuple[list[str], dict[str, dict[str, str]]]:
    """index_problems of one shard's keys, but for the batches; and its tasks."""
    problems: list[str] = []
    tasks: dict[str, dict[str, str]] = {}
    places: dict[str, list[str]] = defaultdict(list)  # task id -> indexes holding it
    scores: dict[str, dict[str, str]] = defaultdict(dict)  # index -> task id -> score
    ready_priorities: dict[str, set[str]] = defaultdict(set)
    prio_sets: dict[str, dict[str, str]] = {}
    parked_priorities: dict[str, set[str]] = defaultdict(set)  # name -> non-empty parked sets
    schedule_hashes: dict[str, dict[str, str]] = {}
    schedule_indexes: dict[str, dict[str, str]] = {key: {} for key in SCHEDULE_INDEXES}
    parkprio_sets: dict[str, dict[str, str]] = {}
    belonging: list[tuple[str, str]] = []  # (key, task id) of a task's steps or events
    tagged: dict[str, dict[str, str]] = {}  # tag -> {task id: score} of the tag: sets
    indexed: dict[str, dict[str, str]] = {}  # entry -> {task id: score} of the pidx: sets
    waits: dict[str, str] = {}
    wait_counts: dict[str, str] = {}
    for key, (kind, value) in snap.items():
        family, _, rest = key.partition(":")
        if family == "t" and kind == "hash":
            tasks[rest] = value
        elif family == "ready" and kind == "list":
            queue, _, priority = rest.rpartition(":")
            ready_priorities[queue].add(priority)
            for task_id in value:
                places[task_id].append(key)
        elif family == "sched" and kind == "zset":
            for task_id, score in value:
                places[task_id].append(key)
                scores[key][task_id] = score
        elif family == "prio" and kind == "zset":
            prio_sets[rest] = dict(value)
        elif family == "parked" and kind == "zset":
            name, _, priority = rest.rpartition(":")
            parked_priorities[name].add(priority)
            for task_id, score in value:
                places[task_id].append(key)
                scores[key][task_id] = score
        elif family == "parkprio" and kind == "zset":
            parkprio_sets[rest] = dict(value)
        elif family == "kparked" and kind == "zset":
            for task_id, score in value:
                places[task_id].append(key)
                scores[key][task_id] = score
        elif (family, kind) in KEY_CAP_KEYS:
            pass  # max_concurrency_per_key's counts and indexes: checked by key_cap_problems
        elif (key in ("leases", "finished") or family == "done") and kind == "zset":
            for task_id, score in value:
                places[task_id].append(key)
                scores[key][task_id] = score
        elif key == "deadlines" and kind == "zset":
            scores[key] = dict(value)
        elif family == "s" and kind == "hash":
            schedule_hashes[rest] = value
        elif key in SCHEDULE_INDEXES and kind == "zset":
            schedule_indexes[key] = dict(value)
        elif (family, kind) in RATE_KEYS:
            pass  # rate_limit's logs: no task is in them
        elif family == "tput" and kind == "hash":
            pass  # the admin chart's endings per minute (throughput.py): counts, no task
        elif family == "i" and kind == "string":
            pass  # REDIS_SHARDS > 1: the task-id directory (id_reserve.lua), no index
        elif family == "u" and kind == "string":
            pass  # unique keys (submit.lua, unique_reserve.lua): expire with their window
        elif family == "deps" and kind == "set":
            pass  # dependencies: the dependents of task <id> (settled by its ending script)
        elif family == "xdone" and kind == "hash":
            pass  # REDIS_SHARDS > 1: outcomes delivered before their dependent was stored
        elif key == "outbox" and kind == "list":
            problems.append(f"outbox holds {len(value)} undelivered messages: {value[:3]}")
        elif (family, kind) == ("bx", "hash"):
            pass  # REDIS_SHARDS > 1: a batch's last applied message per member
        elif (family, kind) in (("b", "hash"), ("bm", "zset")) or (key, kind) in BATCH_INDEXES:
            pass  # batches: checked by batch_problems
        elif family == "tag" and kind == "zset":
            tagged[rest] = dict(value)  # tags (list_tasks(tag=...)): checked below
        elif family == "pidx" and kind == "zset":
            indexed[rest] = dict(value)  # the parameter index: parameter_index_problems
        elif family in ("steps", "events") and kind == "hash":
            belonging.append((key, rest))  # durable steps, events sent: of a stored task
        elif key == "waits" and kind == "hash":
            waits = value  # durable waits: task id -> kind (suspend.lua)
        elif key == "waits:count" and kind == "hash":
            wait_counts = value
        elif family == "wake" and kind == "list":
            if value != ["1"]:
                problems.append(f"{key} holds {value}, not one token")
        elif (key, kind) not in KNOWN_KEYS and (family, kind) != ("lock", "string"):
            problems.append(f"unexpected key {key} ({kind})")

    for key, task_id in belonging:
        if task_id not in tasks:
            problems.append(f"{key} belongs to no stored task")
    # Each task is in the set of each of its tags, scored by its creation, and in no other.
    for tag, members in tagged.items():
        for task_id, score in members.items():
            task = tasks.get(task_id)
            if task is None or tag not in json.loads(task.get("tg", "[]")):
                problems.append(f"tag:{tag} holds {task_id}, not a stored task of that tag")
            elif score != task["c"]:
                problems.append(f"tag:{tag} scores {task_id} {score}, not its creation")
    for task_id, task in tasks.items():
        for tag in json.loads(task.get("tg", "[]")):
            if task_id not in tagged.get(tag, {}):
                problems.append(f"task {task_id} of tag {tag!r} is not in tag:{tag}")
    problems += parameter_index_problems(indexed, tasks)
    for task_id, wait_kind in waits.items():
        task = tasks.get(task_id, {})
        if task.get("s") != "PENDING" or "wt" not in task:
            problems.append(f"waits names {task_id}, which is not waiting: {task.get('s')}")
        elif json.loads(task["wt"])[0] != wait_kind:  # [kind, name, until, ids]
            problems.append(f"waits says {task_id} waits for a {wait_kind}: {task['wt']}")
    counted = {k: int(n) for k, n in wait_counts.items() if int(n)}
    actual = dict(Counter(waits.values()))
    if counted != actual:
        problems.append(f"waits:count says {counted}, but waits holds {actual}")
    for queue in ready_priorities.keys() | prio_sets.keys():
        listed = prio_sets.get(queue, {})
        if set(listed) != ready_priorities[queue]:
            problems.append(
                f"prio:{queue} lists {sorted(listed)}, the non-empty ready lists are "
                f"{sorted(ready_priorities[queue])}"
            )
        problems += [
            f"prio:{queue} scores {member} as {score}"
            for member, score in listed.items()
            if float(score) != float(member)
        ]

    for name in parked_priorities.keys() | parkprio_sets.keys():
        listed = parkprio_sets.get(name, {})
        if set(listed) != parked_priorities[name]:
            problems.append(
                f"parkprio:{name} lists {sorted(listed)}, the non-empty parked sets are "
                f"{sorted(parked_priorities[name])}"
            )
        problems += [
            f"parkprio:{name} scores {member} as {score}"
            for member, score in listed.items()
            if float(score) != float(member)
        ]
    parked_names = set(snap.get("parked", ("set", []))[1])
    if parked_names != set(parked_priorities):
        problems.append(
            f"parked set lists {sorted(parked_names)}, the names with parked tasks are "
            f"{sorted(parked_priorities)}"
        )

    def score_matches(index: str, task_id: str, values: dict[str, str], field: str) -> None:
        score = scores[index].get(task_id)
        if score is not None and int(float(score)) != int(values.get(field) or -1):
            problems.append(
                f"{task_id} scored {score} in {index}, its {field} is {values.get(field)}"
            )

    counted: Counter[str] = Counter()
    leased_names: Counter[str] = Counter()  # task name -> tasks of it in the leases
    queues = set(snap.get("queues", ("set", []))[1])
    for task_id, values in tasks.items():
        status, queue, priority = values.get("s"), values.get("q"), values.get("p")
        counted[f"{status}:{queue}"] += 1
        where = sorted(places.pop(task_id, []))
        task_name = values.get("n")
        if "leases" in where:
            leased_names[str(task_name)] += 1
        if status in WAITING:
            allowed = [
                [f"ready:{queue}:{priority}"],
                [f"sched:{queue}"],
                [f"parked:{task_name}:{priority}"],
                ["leases"],
            ]
            if "ck" in values:  # parked by its own name and key only
                allowed.append([f"kparked:{key_bucket(str(task_name), values['ck'])}:{priority}"])
        elif status == "RUNNING":
            allowed = [["leases"]]
        elif status in TERMINAL:
            allowed = [sorted(["finished", f"done:{status}"])]
            if status == "TIMEOUT":  # timed out while running: the holder keeps its lease
                allowed.append(sorted(["finished", "done:TIMEOUT", "leases"]))
        else:
            allowed = []
        if where not in allowed:
            problems.append(f"{task_id} is {status} but in {where or 'no index'}")
        # Debounce: a task joined while it waited due keeps its place, marked (claim.lua
        # schedules it when it pops it early); the mark goes when it leaves that place.
        joined_due = len(where) == 1 and where[0].split(":")[0] in ("ready", "parked", "kparked")
        if "jd" in values and (status != "CREATED" or not joined_due):
            problems.append(f"{task_id} is marked joined while due (jd) but {status} in {where}")
        if "leases" in where and not values.get("w"):
            problems.append(f"{task_id} holds a lease but names no worker")
        if status == "RUNNING" and not values.get("st"):
            problems.append(f"{task_id} is RUNNING without a start time")
        score_matches(f"sched:{queue}", task_id, values, "r")
        score_matches(f"parked:{task_name}:{priority}", task_id, values, "r")
        if "ck" in values:
            bucket = key_bucket(str(task_name), values["ck"])
            score_matches(f"kparked:{bucket}:{priority}", task_id, values, "r")
        score_matches("finished", task_id, values, "f")
        score_matches(f"done:{status}", task_id, values, "c")
        has_deadline = status not in TERMINAL and "d" in values
        if has_deadline != (task_id in scores["deadlines"]):
            problems.append(f"{task_id} ({status}, d={values.get('d')}) vs the deadlines index")
        score_matches("deadlines", task_id, values, "d")
        if queue not in queues:
            problems.append(f"{task_id}'s queue {queue} is not in the queues set")
    problems += [f"{', '.join(where)} hold unknown task {i}" for i, where in places.items()]
    problems += [f"deadlines holds unknown task {i}" for i in scores["deadlines"] if i not in tasks]

    held = {field: int(n) for field, n in snap.get("held", ("hash", {}))[1].items()}
    if held != dict(leased_names):
        problems.append(f"held hash {held} but the leases hold {dict(leased_names)} by name")
    problems += key_cap_problems(snap, tasks)

    problems += schedule_problems(schedule_hashes, schedule_indexes)

    stored = {field: int(n) for field, n in snap.get("counts", ("hash", {}))[1].items()}
    if {field: n for field, n in stored.items() if n != 0} != dict(counted):
        problems.append(f"counts hash {stored} but the tasks are {dict(counted)}")
    # A queue is remembered exactly while it holds a task: no name stays behind its last one.
    holding = {values.get("q") for values in tasks.values()}
    problems += [f"queues set lists {q}, which holds no task" for q in sorted(queues - holding)]
    problems += [
        f"counts hash keeps {field} of {queue}, which is not in the queues set"
        for field in sorted(stored)
        for queue in [field.partition(":")[2]]
        if queue not in queues
    ]
    problems += [
        f"{key} is a key of {queue}, which is not in the queues set"
        for key in sorted(snap)
        for queue in [_queue_of(key)]
        if queue is not None and queue not in queues
    ]
    return problems, tasks


BATCH_COUNTERS = {"COMPLETED": "ok", "CANCELLED": "cx", "FAILED": "ko", "TIMEOUT": "ko"}
BATCH_COUNTERS["ERROR"] = "ko"


BATCH_INDEXES = {("batches", "zset"), ("batches:finished", "zset")}


def parameter_index_problems(
    indexed: dict[str, dict[str, str]], tasks: dict[str, dict[str, str]]
) -> list[str]:
    """Each task is in the ``pidx:`` set of each entry its ``px`` lists, scored by its
    creation, and in no other (storage/redis/parameter_index.py)."""
    problems = []
    for entry, members in indexed.items():
        for task_id, score in members.items():
            task = tasks.get(task_id)
            if task is None or entry not in json.loads(task.get("px", "[]")):
                problems.append(f"pidx:{entry} holds {task_id}, not a stored task of that entry")
            elif score != task["c"]:
                problems.append(f"pidx:{entry} scores {task_id} {score}, not its creation")
    for task_id, task in tasks.items():
        for entry in json.loads(task.get("px", "[]")):
            if task_id not in indexed.get(entry, {}):
                problems.append(f"task {task_id} of entry {entry!r} is not in pidx:{entry}")
    return problems


def _member_of(task: dict[str, str], batch_id: str | None, batches: dict) -> bool:
    """Is ``task`` a member of the stored batch ``batch_id`` (of its generation)?"""
    batch = batches.get(batch_id)
    return (
        task.get("bt") == batch_id
        and batch is not None
        and task.get("bg", "") == batch.get("g", "")
    )


def batch_problems(snap: Snapshot, tasks: dict[str, dict[str, str]]) -> list[str]:
    """Each batch hash's counters equal its members as stored: n the members (tasks whose bt
    names it and whose bg is its generation g: a member of a purged batch of the same id is
    none of its), ok/ko/cx the ended ones by outcome (ended members purged: at least those left,
    and the others all live); its
    member index holds each member once, in its status's group (LIVE until it ends), scored
    by creation; the finished index holds exactly the finished batches, by finish time."""
    problems: list[str] = []
    batches = {}
    indexed: dict[str, list[tuple[str, str]]] = defaultdict(list)  # member -> (key, score)
    for key, (kind, value) in snap.items():
        family, _, rest = key.partition(":")
        if family == "b" and kind == "hash":
            batches[rest] = value
        elif family == "bm" and kind == "zset":
            for task_id, score in value:
                indexed[task_id].append((key, score))
    for batch_id, value in batches.items():
        members = [t for t in tasks.values() if _member_of(t, batch_id, batches)]
        expected = {"n": len(members), "ok": 0, "ko": 0, "cx": 0}
        for member in members:
            counter = BATCH_COUNTERS.get(member["s"])
            if counter is not None:
                expected[counter] += 1
        stored = {field: int(value.get(field, 0)) for field in expected}
        if stored["n"] > expected["n"]:
            # Members purged (ended ones only): the ended counters may exceed what is left,
            # the members not ended are exactly the ones stored live.
            live = sum(1 for member in members if member["s"] not in BATCH_COUNTERS)
            pending = stored["n"] - stored["ok"] - stored["ko"] - stored["cx"]
            if pending != live or any(stored[c] < expected[c] for c in ("ok", "ko", "cx")):
                problems.append(f"batch {batch_id} counts {stored}, its members left {expected}")
        elif stored != expected:
            problems.append(f"batch {batch_id} counts {stored}, its members {expected}")
    for task_id, task in tasks.items():
        batch_id = task.get("bt")
        group = task["s"] if task["s"] in BATCH_COUNTERS else "LIVE"
        want = (
            [(f"bm:{batch_id}:{group}", task["c"])] if _member_of(task, batch_id, batches) else []
        )
        if indexed.pop(task_id, []) != want:
            problems.append(f"task {task_id} of batch {batch_id} not indexed as {want}")
    problems += [
        f"{key} holds {task_id}, no such task" for task_id in indexed for key, _ in indexed[task_id]
    ]
    finished = {b: v["f"] for b, v in batches.items() if v.get("f")}
    listed = dict(snap.get("batches:finished", ("zset", []))[1])
    if listed != finished:
        problems.append(f"batches:finished holds {listed}, the finished batches {finished}")
    return problems


# max_concurrency_per_key's counts and indexes (lua/_common.lua), but for the parked sets.
KEY_CAP_KEYS = {("heldkey", "hash"), ("kparkprio", "zset"), ("kparkkeys", "set")}


def _split_bucket(rest: str) -> tuple[str, str]:
    """(name, what follows it) of ``<len>:<name>:...``, key_bucket's form."""
    length, _, tail = rest.partition(":")
    raw = tail.encode()
    return raw[: int(length)].decode(), raw[int(length) + 1 :].decode()


def key_cap_problems(snap: Snapshot, tasks: dict[str, dict[str, str]]) -> list[str]:
    """max_concurrency_per_key's indexes against the tasks (each task's own place, in a
    ``kparked`` set of its name, key and priority or elsewhere, is checked with the others):
    ``heldkey:<name>`` counts the leased tasks of each key of the name; ``kparkprio`` lists
    the non-empty parked sets of a bucket, ``kparkkeys:<name>`` the keys of the name with
    some, the ``kparked`` set the names with some."""
    problems: list[str] = []
    parked: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    listed: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)  # name -> key -> prios
    held: dict[str, dict[str, int]] = {}
    keys_of: dict[str, set[str]] = {}
    for index, (kind, value) in snap.items():
        family, _, rest = index.partition(":")
        if (family, kind) == ("kparked", "zset"):
            name, after = _split_bucket(rest)
            key, _, priority = after.rpartition(":")
            parked[name][key].add(priority)
        elif (family, kind) == ("kparkprio", "zset"):
            name, key = _split_bucket(rest)
            listed[name][key] = dict(value)
        elif (family, kind) == ("heldkey", "hash"):
            held[rest] = {key: int(n) for key, n in value.items()}
        elif (family, kind) == ("kparkkeys", "set"):
            keys_of[rest] = set(value)
    for name in parked.keys() | listed.keys():
        for key in parked[name].keys() | listed[name].keys():
            prios = listed[name].get(key, {})
            if set(prios) != parked[name][key]:
                problems.append(
                    f"kparkprio:{key_bucket(name, key)} lists {sorted(prios)}, the non-empty "
                    f"parked sets of the key are {sorted(parked[name][key])}"
                )
            problems += [
                f"kparkprio:{key_bucket(name, key)} scores {member} as {score}"
                for member, score in prios.items()
                if float(score) != float(member)
            ]
    with_parked = {name: set(keys) for name, keys in parked.items() if keys}
    if keys_of != with_parked:
        problems.append(f"kparkkeys sets hold {keys_of}, the keys with parked tasks {with_parked}")
    names = set(snap.get("kparked", ("set", []))[1])
    if names != set(with_parked):
        problems.append(f"kparked lists {sorted(names)}, not {sorted(with_parked)}")
    leased: dict[str, Counter[str]] = defaultdict(Counter)
    for task_id, _ in snap.get("leases", ("zset", []))[1]:
        task = tasks.get(task_id, {})
        if "ck" in task:
            leased[task["n"]][task["ck"]] += 1
    if held != {name: dict(keys) for name, keys in leased.items()}:
        problems.append(f"heldkey hashes {held}, but the leases hold {dict(leased)} by key")
    return problems


# rate_limit's logs and notes: no task's place is in them.
RATE_KEYS = {
    ("rate", "zset"),
    ("ratenext", "string"),
    ("ratekeys", "zset"),
    ("ratewait", "zset"),
    ("ratespec", "hash"),
}
SCHEDULE_INDEXES = ("schedules", "schedules:due", "schedules:paused")


def _queue_of(key: str) -> str | None:
    """The queue a per-queue waiting index belongs to (ready lists, prio and sched sets)."""
    family, _, rest = key.partition(":")
    if family == "ready":
        return rest.rpartition(":")[0]
    return rest if family in ("prio", "sched") else None


def schedule_problems(
    hashes: dict[str, dict[str, str]], indexes: dict[str, dict[str, str]]
) -> list[str]:
    """Every schedule hash is listed by id; the active ones are in the due index scored by
    their next run, the paused ones in the paused index, and nothing else is in either."""
    problems: list[str] = []
    if set(indexes["schedules"]) != set(hashes):
        problems.append(
            f"schedules lists {sorted(indexes['schedules'])}, the hashes are {sorted(hashes)}"
        )
    active = {i: v["nr"] for i, v in hashes.items() if "pa" not in v}
    due = {i: str(int(float(score))) for i, score in indexes["schedules:due"].items()}
    if due != active:
        problems.append(f"schedules:due is {due}, the active schedules' next runs {active}")
    paused = {i for i, v in hashes.items() if "pa" in v}
    if set(indexes["schedules:paused"]) != paused:
        problems.append(f"schedules:paused is {sorted(indexes['schedules:paused'])}, not {paused}")
    return problems


def assert_consistent(storage: RedisStorage) -> None:
    problems = index_problems(storage)
    assert problems == [], problems


# -- driving tasks into a state -------------------------------------------------------------
def call(storage: RedisStorage, name: str, *args: Any) -> Any:
    """One script run directly: ARGV[1] the prefix, ARGV[2] now (the fake clock), then args."""
    script = getattr(storage._scripts, name)
    return script(keys=storage._routes[0], args=[storage.p, micros(storage.clock.now()), *args])


def submit(executor: ReliableExecutor, task_id: str, **options: Any) -> TaskInfo:
    """A demo.echo task; a failed attempt retries at once (interval 0) up to three times."""
    options = {"retry_limit": 3, "retry_interval": 0, **options}
    return executor.submit("demo.echo", {"id": task_id}, task_id=task_id, **options)


def claim_one(storage: RedisStorage, worker: str = WORKER_A, queue: str = "default") -> Claim:
    [claim] = storage.claim(worker, [queue], 1, LEASE)
    return claim


def running(
    storage: RedisStorage, executor: ReliableExecutor, task_id: str, **options: Any
) -> Claim:
    submit(executor, task_id, **options)
    started = storage.start(claim_one(storage), LEASE)
    assert started is not None
    return started


def rerun_elsewhere(storage: RedisStorage, clock: FakeClock, claim: Claim) -> Claim:
    """Worker A's lease on a RUNNING task runs out, recovery sends the task back to its queue
    and worker B claims and starts it: A's ``claim`` is stale though the task is RUNNING."""
    clock.advance(LEASE + 1)
    [transition] = storage.recover_expired(100)
    assert transition.status is TaskStatus.PENDING
    started = storage.start(claim_one(storage, WORKER_B, claim.task.queue), LEASE)
    assert started is not None and started.token > claim.token
    return started


def fields_of(storage: RedisStorage, task_id: str) -> dict[str, str]:
    return storage.client.hgetall(storage.p + "t:" + task_id)


def lease_score(storage: RedisStorage, task_id: str) -> float | None:
    return storage.client.zscore(storage.p + "leases", task_id)


def later(clock: FakeClock, seconds: float) -> str:
    return micros(clock.now() + dt.timedelta(seconds=seconds))


def advance_to(clock: FakeClock, when: dt.datetime) -> None:
    clock.advance((when - clock.now()) / dt.timedelta(seconds=1))
    assert clock.now() == when
