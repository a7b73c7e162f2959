"""The named leases of the Redis storage (master and chore locks): a key per name, set by Lua;
and the API's one-time nonces, a key each that expires with them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from ...exceptions import StorageUnavailableError
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
        return self.lock_owners([name])[name]

    @guarded
    def lock_owners(self, names: Sequence[str]) -> dict[str, str | None]:
        # one MGET: every lock is on the control shard
        values = self.client.mget([self.p + "lock:" + name for name in names]) if names else []
        now = self.clock.now()
        owners: dict[str, str | None] = {}
        for name, value in zip(names, values, strict=True):
            expires, _, owner = text(value).partition(":") if value is not None else ("", "", "")
            owners[name] = owner if value is not None and from_micros(expires) >= now else None
        return owners

    def spend_nonce(self, name: str, ttl_seconds: float) -> bool:
        from redis.exceptions import RedisError  # redis is an optional dependency

        try:
            return bool(
                self.client.set(
                    self.p + "api-nonce:" + name, "1", nx=True, px=max(1, int(ttl_seconds * 1000))
                )
            )
        except RedisError as exc:
            raise StorageUnavailableError(f"Redis nonce store: {exc}") from exc
