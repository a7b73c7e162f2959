"""Where a key prefix's keys live: its shards' hash tags, and which shard each queue is in."""

from __future__ import annotations

import dataclasses
import functools
import zlib

from ...core.numbers import is_int

CLUSTER_SLOTS = 16384  # Redis Cluster's hash slots
CONTROL_SHARD = 0  # the shard of what belongs to no queue: master lock, workers, named locks


def shard_of(queue: str, shards: int) -> int:
    """The shard of ``queue`` among ``shards``: CRC-32 (zlib.crc32, unsigned) of its UTF-8
    name, modulo ``shards``. Stable across processes, versions and platforms; documented in
    docs/redis-shards.md, so changing it is a change of layout."""
    if shards == 1:
        return 0
    return zlib.crc32(queue.encode("utf-8")) % shards


def directory_of(task_id: str, shards: int) -> int:
    """The directory shard of a task id: the shard that decides every submit of the id (the
    same hash as shard_of). A task whose queue is on another shard has an entry there."""
    return shard_of(task_id, shards)


def unique_home(digest: str, shards: int) -> int:
    """The home shard of a unique key (its digest): the shard that decides every submit of the
    key (the same hash as shard_of). A task of another shard's queue reserves it there."""
    return shard_of(digest, shards)


def native_id(task_id: str, shard: int, shards: int) -> str:
    """A derived id (a schedule's fire) made native to ``shard``: ``task_id`` itself when its
    directory shard is ``shard`` (always with one shard), else ``<task_id>~<k>`` for the
    smallest k >= 1 whose directory shard is ``shard`` (``shards`` tries on average, no I/O).
    Deterministic, so every master derives the same id for the same run; stored on its
    directory shard, it is found by ``get()`` with one read, no directory entry needed."""
    if shards == 1:
        return task_id
    crc = zlib.crc32(task_id.encode("utf-8"))
    if crc % shards == shard:
        return task_id
    # CRC-32 goes on from the id's own: crc32(suffix, crc32(id)) is crc32(id + suffix).
    k = 1
    while zlib.crc32(b"~%d" % k, crc) % shards != shard:
        k += 1
    return f"{task_id}~{k}"


@functools.cache
def shard_prefix(key_prefix: str, index: int, shards: int) -> str:
    """The prefix of every key of shard ``index`` of ``shards``, its hash tag in braces.

    One shard: ``{KEY_PREFIX}:``, the layout of every version before shards. More:
    ``{KEY_PREFIX:shard-<i>-of-<N>:<salt>}:``, where salt is the smallest integer >= 0 that
    puts the tag's Cluster slot in the i-th N-th of the slot space, so that N shards spread
    evenly over masters holding contiguous slot ranges (as ``redis-cli --cluster create``
    assigns them) instead of meeting on one by chance."""
    if not 0 <= index < shards:
        raise ValueError(f"shard {index} is not one of {shards}")
    if shards == 1:
        return "{" + key_prefix + "}:"
    low, high = index * CLUSTER_SLOTS // shards, (index + 1) * CLUSTER_SLOTS // shards
    salt = 0
    while True:
        tag = f"{key_prefix}:shard-{index}-of-{shards}:{salt}"
        if low <= _slot(tag) < high:
            return "{" + tag + "}:"
        salt += 1


def _slot(tag: str) -> int:
    """The Cluster slot of a hash tag's text: CRC16 (XMODEM), modulo the slots."""
    crc = 0
    for byte in tag.encode("utf-8"):
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % CLUSTER_SLOTS


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """The shards of one key prefix: their key prefixes, and the shard of each queue."""

    key_prefix: str
    shards: int = 1

    def __post_init__(self) -> None:
        if not is_int(self.shards) or self.shards < 1:
            raise ValueError(f"shards must be an integer >= 1, not {self.shards!r}")
        if self.shards > CLUSTER_SLOTS:
            raise ValueError(f"shards must be at most {CLUSTER_SLOTS}, not {self.shards!r}")

    @functools.cached_property
    def prefixes(self) -> tuple[str, ...]:
        """Each shard's key prefix, by index."""
        return tuple(shard_prefix(self.key_prefix, i, self.shards) for i in range(self.shards))

    def shard_of(self, queue: str) -> int:
        return shard_of(queue, self.shards)

    def prefix_of(self, queue: str) -> str:
        """The key prefix of ``queue``'s shard."""
        return self.prefixes[shard_of(queue, self.shards)]

    def by_shard(self, queues: list[str] | tuple[str, ...]) -> dict[int, list[str]]:
        """``queues`` grouped by shard, each group in the given order."""
        groups: dict[int, list[str]] = {}
        for queue in queues:
            groups.setdefault(shard_of(queue, self.shards), []).append(queue)
        return groups
