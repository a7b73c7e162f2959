"""rate_limit on the Redis storage: reading how much of each limit is in use.

The limits themselves are enforced by claim.lua (see the rate functions of _common.lua): a
sorted set of claim times per (name, rate key), ``ratekeys:`` listing a name's keys by latest
claim and ``ratewait:`` its tasks held back, all trimmed as they are written and expiring
once idle.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping

from ...core.queries import RateUse
from ...core.rate_limits import RateLimit
from .access import RedisAccess, guarded
from .codec import micros


def bucket(name: str, rate_key: str) -> str:
    """The log's name part, as rate_bucket in _common.lua (Lua counts bytes)."""
    return f"{len(name.encode())}:{name}:{rate_key}"


class RateReading(RedisAccess):
    """rate_use: the logs read in two pipelined round trips."""

    @guarded
    def rate_use(self, limits: Mapping[str, RateLimit]) -> builtins.list[RateUse]:
        # Each shard logs the claims made on it (a name claimed on k shards has k logs): the
        # shards' figures added, the busiest key the busiest of one shard.
        parts = [self._rate_use_on(limits, prefix) for prefix in self.prefixes]
        if len(parts) == 1:
            return parts[0]
        return [
            RateUse(
                uses[0].task_name,
                uses[0].limit,
                sum(use.started for use in uses),
                max(use.busiest for use in uses),
                sum(use.keys for use in uses),
                sum(use.held_back for use in uses),
            )
            for uses in zip(*parts, strict=True)
        ]

    def _rate_use_on(self, limits: Mapping[str, RateLimit], prefix: str) -> builtins.list[RateUse]:
        now = int(micros(self.clock.now()))
        names = list(limits)
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            short = f"{len(name.encode())}:{name}"
            window = round(limits[name].window_seconds * 1e6)
            pipe.zrangebyscore(prefix + "ratekeys:" + short, now - window, "+inf")
            pipe.zcount(prefix + "ratewait:" + short, f"({now}", "+inf")
        replies = pipe.execute()
        pipe = self.client.pipeline(transaction=False)
        keys_of = {}
        for i, name in enumerate(names):
            keys_of[name] = [k.decode() if isinstance(k, bytes) else k for k in replies[2 * i]]
            window = round(limits[name].window_seconds * 1e6)
            for key in keys_of[name]:
                pipe.zcount(prefix + "rate:" + bucket(name, key), f"({now - window}", "+inf")
        counts = iter(pipe.execute())
        uses = []
        for i, name in enumerate(names):
            recent = [int(next(counts)) for _ in keys_of[name]]
            uses.append(
                RateUse(
                    name,
                    limits[name],
                    sum(recent),
                    max(recent, default=0),
                    sum(1 for n in recent if n),
                    int(replies[2 * i + 1]),
                )
            )
        return uses
