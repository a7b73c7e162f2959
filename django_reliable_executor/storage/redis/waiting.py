"""An idle worker's wait on a sharded Redis storage: one blocking pop per shard at once."""

from __future__ import annotations

import concurrent.futures
import os
import threading
import time
from typing import Any


class ShardWaiters:
    """Blocks on the wake lists of several shards at once, one BLPOP per shard on a thread of
    its own (no command blocks on keys of several Cluster slots), and returns at the first
    token, telling which shards had one. A pop still running when a wait returns is kept: the
    next wait on the same keys reuses it rather than sending another, and a token it took
    meanwhile ends the next wait at once, so no wake is lost. (A wait on other keys of a shard,
    e.g. the fetcher's own wake key added while its pool is full, sends its own pop beside the
    one still running.)"""

    def __init__(self, client: Any, shards: int) -> None:
        self._client = client
        # threads: two per shard (a pop under way and one on other keys), so no pop waits for
        # another's to end
        self._threads = 2 * shards
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._pool = _pool(self._threads)
        # (shard, its keys) -> the pop under way
        self._pending: dict[tuple[int, tuple[str, ...]], concurrent.futures.Future[Any]] = {}

    def wait(self, groups: dict[int, list[str]], timeout: float) -> set[int]:
        """Block up to ``timeout`` seconds on the wake keys of each shard (``groups``: shard
        -> keys). The shards whose token came, from this wait or a pop an earlier one left
        (empty: none came)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._pid != os.getpid():  # forked: the parent's threads are not ours
                    self._pool, self._pending, self._pid = _pool(self._threads), {}, os.getpid()
                woken = self._collect()
                if woken:
                    return woken
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return woken
                # A pop that ended empty (an earlier, shorter wait's) is sent again.
                wanted = [(shard, tuple(keys)) for shard, keys in groups.items()]
                for pop in wanted:
                    if pop not in self._pending:
                        self._pending[pop] = self._pool.submit(
                            self._client.blpop, list(pop[1]), max(remaining, 0.001)
                        )
                # Every pop under way, not only the wanted ones: an earlier wait's pop on
                # other keys of a wanted shard may take this wait's token (it returned at
                # its own timeout, up to 5 s late, when only the new pop was watched).
                futures = list(self._pending.values())
            concurrent.futures.wait(
                futures, remaining, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def _collect(self) -> set[int]:
        """Drop the finished pops; the shards of those that took a token (an error raised)."""
        woken = set()
        for pop, future in list(self._pending.items()):
            if future.done():
                del self._pending[pop]
                if future.result() is not None:
                    woken.add(pop[0])
        return woken

    def close(self) -> None:
        """Stop the threads; a pop under way ends at its timeout."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=threads, thread_name_prefix="reliable-executor-wait"
    )
