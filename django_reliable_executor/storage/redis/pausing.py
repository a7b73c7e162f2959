"""Paused queues on the Redis storage: the ``queues:paused`` set, which claim.lua reads."""

from __future__ import annotations

from .access import RedisAccess, guarded
from .codec import text


class Pausing(RedisAccess):
    """pause_queue, resume_queue, paused_queues. claim.lua skips every queue in the set (one
    SISMEMBER per queue of the call), so a pause holds from the very next claim."""

    @guarded
    def pause_queue(self, queue: str) -> bool:
        return bool(self.client.sadd(self._queue_prefix(queue) + "queues:paused", queue))

    @guarded
    def resume_queue(self, queue: str) -> bool:
        if not self.client.srem(self._queue_prefix(queue) + "queues:paused", queue):
            return False
        # Idle workers blocked on the queue's wake list claim its waiting tasks now.
        self.wake([queue])
        return True

    @guarded
    def paused_queues(self) -> set[str]:
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:  # each queue's flag is on its shard
            pipe.smembers(prefix + "queues:paused")
        return {text(queue) for members in pipe.execute() for queue in members}
