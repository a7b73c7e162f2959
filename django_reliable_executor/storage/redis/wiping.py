"""Deleting every key of a Redis storage's key prefix: a test's own prefix, dropped afterwards."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import RedisStorage


def delete_every_key(storage: RedisStorage) -> int:
    """Delete every key under ``storage``'s key prefix, on every shard: ``{prefix}:...`` and,
    sharded, ``{prefix:shard-...}...`` (docs/storage-layouts.md). Returns how many."""
    client = storage.client
    prefix = storage.key_prefix
    deleted = 0
    for pattern in ("{" + prefix + "}:*", "{" + prefix + ":shard-*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 500):
            deleted += client.delete(*keys[start : start + 500])
    return deleted
