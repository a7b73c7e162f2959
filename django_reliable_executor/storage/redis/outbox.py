"""Sharded Redis: delivering each shard's outbox of messages (lua/_common.lua) to their shards."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# Messages read from one outbox at a time (the worker's delivery after its own change; the
# master's chore reads up to its batch).
DELIVERY_CHUNK = 100


def deliver(
    client: Any,
    prefixes: Sequence[str],
    apply: Callable[[list[Any], int], int],
    shards: Iterable[int],
    limit: int,
    visits: int,
) -> int:
    """Deliver up to ``limit`` messages from the outbox of each of ``shards``, in order, then
    from the outboxes their applying wrote to (a cancel cascading, a batch finishing), at most
    ``visits`` outbox reads in all. Returns how many messages were delivered.

    At least once: a message is applied (``apply(messages, target)``: outbox_apply.lua, which
    applies each once however often it comes, and answers how many messages the target's own
    outbox holds then) before it is removed from its outbox, by value
    (LREM), so a delivery killed between the two, or two deliveries at once, send it again and
    change nothing twice. A target whose apply fails keeps its messages (the others are
    delivered, each target's in order), and the failure is raised."""
    todo = list(dict.fromkeys(shards))
    delivered = 0
    failure: Exception | None = None
    while todo and visits > 0:
        visits -= 1
        shard = todo.pop(0)
        key = prefixes[shard] + "outbox"
        raw = client.lrange(key, 0, limit - 1)
        if not raw:
            continue
        by_target: dict[int, list[Any]] = {}
        for message in raw:
            by_target.setdefault(int(json.loads(message)["to"]), []).append(message)
        sending, applied = [], []
        for target, messages in sorted(by_target.items()):
            try:
                if apply(messages, target):
                    sending.append(target)
            except Exception as exc:  # kept for the next delivery; the other targets go on
                failure = failure or exc
                continue
            applied += messages
        if applied:
            pipe = client.pipeline(transaction=False)
            for message in applied:
                pipe.lrem(key, 1, message)
            pipe.execute()
        delivered += len(applied)
        for shard_next in [*sending, *([shard] if len(raw) >= limit else [])]:
            if shard_next not in todo:
                todo.append(shard_next)
    if failure is not None:
        raise failure
    return delivered
