"""The index checks of the Redis tests, knowing fairness="round_robin": the fair sets and their
indexes against the tasks, then the shared checks (tests/support/redis_support.py) on the same
snapshot with each fair set read as the ready list it stands for."""

from __future__ import annotations

from collections import defaultdict

from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.codec import fair_member
from tests.support.redis_support import (
    WAITING,
    Snapshot,
    _shard_problems,
    batch_problems,
    snapshot,
)

FAIR_FAMILIES = ("fready", "fnames", "fprio", "fparked", "fround")


def split_fair_set(rest: str) -> tuple[str, str, str]:
    """(name, queue, priority) of a fair set's ``<len>:<name>:<queue>:<prio>``."""
    length, _, tail = rest.partition(":")
    raw = tail.encode()
    name, after = raw[: int(length)].decode(), raw[int(length) + 1 :].decode()
    queue, _, priority = after.rpartition(":")
    return name, queue, priority


def fair_problems(storage: RedisStorage) -> list[str]:
    """Everything wrong with the prefix's indexes, fair ones included: each shard's, then the
    batches (on shard 0) against the members of every shard, as index_problems does."""
    problems: list[str] = []
    tasks: dict[str, dict[str, str]] = {}
    plains = []
    for shard in range(len(storage.prefixes)):
        found, plain = fair_shard_problems(snapshot(storage, shard))
        more, shard_tasks = _shard_problems(plain)
        tag = f"shard {shard}: " if storage.sharded else ""
        problems += [tag + problem for problem in found + more]
        tasks.update(shard_tasks)
        plains.append(plain)
    return problems + batch_problems(plains[0], tasks)


def fair_shard_problems(snap: Snapshot) -> tuple[list[str], Snapshot]:
    """What is wrong with one shard's fair sets and their indexes, and its snapshot as the
    shared checks know it (plain_snapshot)."""
    problems: list[str] = []
    tasks = {key[2:]: value for key, (kind, value) in snap.items() if key.startswith("t:")}
    sets: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
    listed: dict[str, tuple[str, object]] = {}
    fair_parked: dict[tuple[str, str, str], set[tuple[str, int]]] = defaultdict(set)
    parked: dict[tuple[str, str, str], set[tuple[str, int]]] = defaultdict(set)
    for key, (kind, value) in snap.items():
        family, _, rest = key.partition(":")
        if family == "fready" and kind == "zset":
            sets[split_fair_set(rest)] = value
        elif family == "fparked" and kind == "zset":
            fair_parked[split_fair_set(rest)] = {(i, int(float(s))) for i, s in value}
        elif family == "fround" and kind == "zset":
            split_fair_set(rest)  # (one of a name, queue and priority)
        elif family in FAIR_FAMILIES:
            listed[key] = (kind, value)
        if family in ("parked", "kparked") and kind == "zset":  # one with a round: by round
            for task_id, score in value:
                task = tasks.get(task_id, {})
                if "fr" in task:
                    place = (task["n"], task["q"], task["p"])
                    if family == "parked":  # by key: not being served, not in fparked
                        parked[place].add((task_id, int(float(score))))
                    if task["fr"] != str(int(float(score))):
                        problems.append(f"{key} holds {task_id} of round {task['fr']} at {score}")
        elif family == "ready" and kind == "list":  # a task with a round waits by its round
            problems += [
                f"{key} holds {i}, of round {tasks[i]['fr']}"
                for i in value
                if "fr" in tasks.get(i, {})
            ]
    names_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    prios_of: dict[str, set[str]] = defaultdict(set)
    for (name, queue, priority), members in sets.items():
        names_of[queue, priority].add(name)
        prios_of[queue].add(priority)
        for member, score in members:
            run_at, task_id = fair_member(member)
            task = tasks.get(task_id, {})
            seen = (task.get("n"), task.get("q"), task.get("p"), task.get("fr"), task.get("r"))
            if (
                seen != (name, queue, priority, str(int(float(score))), str(run_at))
                or member != f"{run_at:020d}:{task_id}"
                or task.get("s") not in WAITING
            ):
                problems.append(f"fair set {name}/{queue}/{priority} holds {member}: {seen}")
    for (queue, priority), names in names_of.items():
        if set(listed.pop(f"fnames:{queue}:{priority}", ("set", []))[1]) != names:
            problems.append(f"fnames:{queue}:{priority} does not list {sorted(names)}")
    for queue, priorities in prios_of.items():
        found = dict(listed.pop(f"fprio:{queue}", ("zset", []))[1])
        if set(found) != priorities or any(float(s) != float(p) for p, s in found.items()):
            problems.append(f"fprio:{queue} is {found}, the fair sets' priorities {priorities}")
    for place in set(parked) | set(fair_parked):
        if parked.get(place, set()) != fair_parked.get(place, set()):
            problems.append(
                f"fparked of {place} holds {sorted(fair_parked.get(place, set()))}, the tasks"
                f" with a round parked by name {sorted(parked.get(place, set()))}"
            )
    for key, (kind, _) in listed.items():
        if not key.startswith(("fround:", "fparked:")) or kind != "zset":
            problems.append(f"{key} ({kind}) indexes no fair set")
    return problems, plain_snapshot(snap, sets, tasks)


def plain_snapshot(
    snap: Snapshot,
    sets: dict[tuple[str, str, str], list[tuple[str, str]]],
    tasks: dict[str, dict[str, str]],
) -> Snapshot:
    """``snap`` as the shared checks know it: each fair set's tasks in the ready list of its
    queue and priority, no other fair key, and a fair task's parked score (its round) its run
    at."""
    plain: Snapshot = {
        key: value for key, value in snap.items() if key.partition(":")[0] not in FAIR_FAMILIES
    }
    for (_, queue, priority), members in sets.items():
        kind, ready = plain.get(f"ready:{queue}:{priority}", ("list", []))
        ids = [fair_member(member)[1] for member, _ in members]
        plain[f"ready:{queue}:{priority}"] = (kind, [*ready, *ids])
        kind, prios = plain.get(f"prio:{queue}", ("zset", []))
        if priority not in dict(prios):
            plain[f"prio:{queue}"] = (kind, [*prios, (priority, priority)])
    for key, (kind, value) in snap.items():
        if key.partition(":")[0] in ("parked", "kparked") and kind == "zset":
            rescored = []
            for task_id, score in value:
                task = tasks.get(task_id, {})
                if "fr" in task and str(int(float(score))) == task["fr"]:
                    score = task["r"]
                rescored.append((task_id, score))
            plain[key] = (kind, rescored)
    return plain


def assert_fair_consistent(storage: RedisStorage) -> None:
    problems = fair_problems(storage)
    assert problems == [], problems
