"""Paused queues on the Redis storage: the ``queues:paused`` set, which claim.lua reads."""

from __future__ import annotations

from .access import RedisAccess, guarded
from .codec import text


class Pausing(RedisAccess):
    """pause_queue, resume_queue, paused_queues. claim.lua skips every queue in the set (one
    SISMEMBER per queue of the call), so a pause holds from the very next claim."""

    @guarded
    def pause_queue(self, queue: str) -> bool:
        return bool(self.client.sadd(self.p + "queues:paused", queue))

    @guarded
    def resume_queue(self, queue: str) -> bool:
        if not self.client.srem(self.p + "queues:paused", queue):
            return False
        # Idle workers blocked on the queue's wake list claim its waiting tasks now.
        self.wake([queue])
        return True

    @guarded
    def paused_queues(self) -> set[str]:
        return {text(queue) for queue in self.client.smembers(self.p + "queues:paused")}
