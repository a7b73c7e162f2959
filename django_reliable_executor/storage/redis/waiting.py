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
    token. A pop still running when a wait returns is kept: the next wait of its shard reuses
    it rather than sending another, and a token it took meanwhile ends that next wait at once,
    so no wake is lost and a shard never has two pops of this worker at a time."""

    def __init__(self, client: Any, shards: int) -> None:
        self._client = client
        self._shards = shards  # threads: one per shard, so no pop waits for another's
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._pool = _pool(shards)
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}

    def wait(self, groups: dict[int, list[str]], timeout: float) -> bool:
        """Block up to ``timeout`` seconds on the wake keys of each shard (``groups``: shard
        -> keys). True when a token came, from this wait or a pop an earlier one left."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._pid != os.getpid():  # forked: the parent's threads are not ours
                    self._pool, self._pending, self._pid = _pool(self._shards), {}, os.getpid()
                if self._collect():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # A pop that ended empty (an earlier, shorter wait's) is sent again.
                for shard, keys in groups.items():
                    if shard not in self._pending:
                        self._pending[shard] = self._pool.submit(
                            self._client.blpop, keys, max(remaining, 0.001)
                        )
                futures = [self._pending[shard] for shard in groups]
            concurrent.futures.wait(
                futures, remaining, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def _collect(self) -> bool:
        """Drop the finished pops; whether one of them took a token (its error raised)."""
        woken = False
        for shard, future in list(self._pending.items()):
            if future.done():
                del self._pending[shard]
                woken = future.result() is not None or woken
        return woken

    def close(self) -> None:
        """Stop the threads; a pop under way ends at its timeout."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _pool(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(
        max_workers=threads, thread_name_prefix="reliable-executor-wait"
    )
