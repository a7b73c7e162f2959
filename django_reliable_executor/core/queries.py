"""What a worker's claim and a task listing ask of the storage, and what a rate limit's use
reads back: values checked once by the storage interface, then handed to a backend."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from .ids import FIRE_ID_PATTERN, FIRE_TIME_PATTERN
from .parameter_filter import Pairs
from .rate_limits import RateLimit
from .states import TaskStatus


@dataclasses.dataclass(frozen=True)
class ClaimRequest:
    """What a worker's claim asks of the storage (see ``TaskStorage.claim``): up to ``limit``
    due tasks of ``queues`` under a lease of ``lease_seconds``, never more held at once of a
    name in ``name_limits`` (``{task_name: cap}``) than its cap; up to ``start`` of them
    started at once where the storage can. Of a name in ``rate_limits``, no more claimed
    than its limit allows (see ``TaskStorage.claim``). Of a name in ``key_limits``
    (``{task_name: cap}``), never more held at once per ``concurrency_key`` than its cap. Of
    the names with ``fairness`` (the storage's ``flow_limits.fair()``), at most ``fair_limit``
    in all (None: no bound): a worker takes them only for threads free to start them, so they
    never wait in its local queue while their name's turns move on."""

    worker_id: str
    queues: tuple[str, ...]
    limit: int
    lease_seconds: float
    name_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    start: int = 0
    rate_limits: Mapping[str, RateLimit] = dataclasses.field(default_factory=dict)
    key_limits: Mapping[str, int] = dataclasses.field(default_factory=dict)
    fair_limit: int | None = None


@dataclasses.dataclass(frozen=True)
class RateUse:
    """How much of one task name's rate limit is in use now (``TaskStorage.rate_use``)."""

    task_name: str
    limit: RateLimit
    started: int  # claims (starts) in the last window, every rate key together
    busiest: int  # the most of them of one rate key: the key nearest its limit
    keys: int  # rate keys with a claim in the last window
    held_back: int  # waiting tasks held back because their key's window is full


@dataclasses.dataclass(frozen=True)
class KeyUse:
    """How much of one task name's ``max_concurrency_per_key`` is in use now
    (``TaskStorage.key_use``)."""

    task_name: str
    cap: int  # max_concurrency_per_key
    held: int  # tasks held (claimed or running) with a concurrency_key
    keys: int  # keys with a task held
    busiest: tuple[tuple[str, int], ...]  # (key, held) of the busiest keys, busiest first


#: How many of a name's busiest keys ``key_use`` reports.
BUSIEST_KEYS = 5


def key_uses(limits: Mapping[str, int], held: Iterable[tuple[str, str, int]]) -> list[KeyUse]:
    """``TaskStorage.key_use`` from the held counts ``(task name, key, held)`` read, one
    KeyUse per name of ``limits`` in its order (the busiest keys first, then by key)."""
    by_name: dict[str, list[tuple[str, int]]] = {name: [] for name in limits}
    for name, key, count in held:
        if name in by_name and count > 0:
            by_name[name].append((key, count))
    uses = []
    for name, cap in limits.items():
        keys = sorted(by_name[name], key=lambda item: (-item[1], item[0]))
        uses.append(
            KeyUse(name, cap, sum(n for _, n in keys), len(keys), tuple(keys[:BUSIEST_KEYS]))
        )
    return uses


@dataclasses.dataclass(frozen=True)
class TaskQuery:
    """One page of a task listing (see ``TaskStorage.list``), newest first: the tasks of any
    of ``statuses`` (None: any status; never empty), of ``task_name``, ``queue`` and
    ``batch_id`` (a batch's members and callbacks) where given, ``limit`` of them after the
    first ``offset``."""

    statuses: frozenset[TaskStatus] | None
    task_name: str | None
    queue: str | None
    limit: int
    offset: int
    batch_id: str | None = None
    # Schedule runs (tasks a schedule fired, ids "<schedule id>@<planned time>"): True only
    # them, False none of them, None either; ``schedule_id``: only the runs of that schedule.
    schedule_runs: bool | None = None
    schedule_id: str | None = None
    # Only the tasks submitted with this tag (the submit option ``tags``).
    tag: str | None = None
    # Only the tasks whose parameter is an object holding these (key, value) pairs, sorted by
    # key (core/parameter_filter.py).
    parameter: Pairs | None = None
    # The pairs of ``parameter`` the parameter index answers (core/parameter_index.py):
    # (key, canonical value) entries; the storage reads their tasks, then checks every pair.
    indexed: tuple[tuple[str, str], ...] = ()

    @property
    def by_origin(self) -> bool:
        """Whether the query chooses tasks by their origin (schedule runs or not)."""
        return self.schedule_runs is not None or self.schedule_id is not None

    def origin_matches(self, task_id: str) -> bool:
        """Whether a task of this id passes the query's origin filter (see ids.py's patterns)."""
        if self.schedule_id is not None:
            head = self.schedule_id + "@"
            return task_id.startswith(head) and bool(
                re.match(FIRE_TIME_PATTERN, task_id[len(head) :])
            )
        if self.schedule_runs is None:
            return True
        return bool(re.match(FIRE_ID_PATTERN, task_id)) is self.schedule_runs

    @property
    def end(self) -> int:
        """How many of the newest matches the page reaches down to."""
        return self.offset + self.limit
