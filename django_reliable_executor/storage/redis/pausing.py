"""Paused queues on the Redis storage: the ``queues:paused`` set, which claim.lua reads."""

from __future__ import annotations

from .access import RedisAccess, guarded
from .codec import text


class Pausing(RedisAccess):
    """pause_queue, resume_queue, paused_queues. claim.lua skips every queue in the set (one
    SISMEMBER per queue of the call), so a pause holds from the very next claim. Sharded, the
    flag is set on every shard: any of them may hold tasks of the queue."""

    @guarded
    def pause_queue(self, queue: str) -> bool:
        if not self.sharded:
            return bool(self.client.sadd(self.p + "queues:paused", queue))
        # Sharded, on every shard (one pipeline): a queue's tasks are on its own shard and,
        # those of limited names, on their home shards, where claim.lua reads the flag.
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.sadd(prefix + "queues:paused", queue)
        return any(pipe.execute())

    @guarded
    def resume_queue(self, queue: str) -> bool:
        if not self.sharded:
            if not self.client.srem(self.p + "queues:paused", queue):
                return False
            # Idle workers blocked on the queue's wake list claim its waiting tasks now.
            self.wake([queue])
            return True
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:
            pipe.srem(prefix + "queues:paused", queue)
        if not any(pipe.execute()):
            return False
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:  # a worker serving it waits on every shard that may hold it
            pipe.lpush(prefix + "wake:" + queue, "1")
            pipe.ltrim(prefix + "wake:" + queue, 0, 0)
        pipe.execute()
        return True

    @guarded
    def paused_queues(self) -> set[str]:
        pipe = self.client.pipeline(transaction=False)
        for prefix in self.prefixes:  # each queue's flag is on its shard
            pipe.smembers(prefix + "queues:paused")
        return {text(queue) for members in pipe.execute() for queue in members}
