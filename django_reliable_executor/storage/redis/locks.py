"""The named leases of the Redis storage (the master lock): a key per name, set by Lua."""

from __future__ import annotations

import datetime as dt

from .access import RedisAccess, guarded
from .codec import from_micros, micros, text


class Locks(RedisAccess):
    """Locks taken and renewed by compare-and-set Lua (lock_acquire.lua, lock_release.lua)."""

    @guarded
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        now = self.clock.now()
        expires = micros(now + dt.timedelta(seconds=ttl_seconds))
        ttl_millis = max(1, int(ttl_seconds * 1000))
        return self._run("lock_acquire", name, owner, expires, ttl_millis, now=now) == 1

    @guarded
    def release_lock(self, name: str, owner: str) -> None:
        self._run("lock_release", name, owner)

    @guarded
    def lock_owner(self, name: str) -> str | None:
        value = self.client.get(self.p + "lock:" + name)
        if value is None:
            return None
        expires, _, owner = text(value).partition(":")
        return owner if from_micros(expires) >= self.clock.now() else None
