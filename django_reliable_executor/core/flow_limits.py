"""FlowLimits: which task names are claimed one name at a time, as a storage is told it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping


@dataclasses.dataclass(frozen=True)
class FlowLimits:
    """The task names with a ``rate_limit``, ``max_concurrency`` or ``max_concurrency_per_key``
    (the database storage keeps their tasks apart, to claim them one name at a time), those
    with a ``max_concurrency_per_key`` (``keyed``: the database storage parks a full key's
    tasks apart, and puts them back once the name has no such cap), and ``{name: its own
    queue}`` of the limited ones (a sharded Redis storage keeps their tasks on that queue's shard:
    docs/redis-shards.md, "A limited name's home shard"). Functions, asked at each use: a
    handler may register after the storage is built. The registry's are
    ``registry.FLOW_LIMITS``; the service builds its storage with them."""

    names: Callable[[], Collection[str]] = frozenset
    keyed: Callable[[], Collection[str]] = frozenset
    homes: Callable[[], Mapping[str, str]] = dict
    # fairness="round_robin": the storage numbers their tasks' rounds (core/fairness.py).
    fair: Callable[[], Collection[str]] = frozenset
    # Every registered name: the chores clear the rounds of those not fair (an unknown name's
    # tasks are left alone, its fairness may be another deploy's).
    known: Callable[[], Collection[str]] = frozenset


#: No name limited: a storage built on its own (a tool, a test of the storage alone).
NO_FLOW_LIMITS = FlowLimits()
