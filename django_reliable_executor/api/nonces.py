"""One-time nonces of signed requests, kept in the executor's own store until they expire."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

from django.db import IntegrityError, transaction

from ..exceptions import StorageUnavailableError
from ..models import ReliableApiNonce
from ..service.reliable_executor import executor

PURGE_EVERY = 60.0  # seconds between purges of expired database rows, per process
_purge_lock = threading.Lock()
_last_purge = 0.0


def claim(key_id: str, nonce: str, ttl: float) -> bool:
    """Remember ``nonce`` of ``key_id`` for ``ttl`` seconds; False if it is already remembered."""
    name = f"{key_id}:{nonce}"
    if executor.settings.STORAGE == "redis":
        return _claim_redis(name, ttl)
    return _claim_database(name, ttl)


def _claim_redis(name: str, ttl: float) -> bool:
    from redis.exceptions import RedisError

    storage: Any = executor.storage  # a RedisStorage: its client and "{KEY_PREFIX}:" hash tag
    try:
        return bool(
            storage.client.set(
                storage.p + "api-nonce:" + name, "1", nx=True, px=max(1, int(ttl * 1000))
            )
        )
    except RedisError as exc:
        raise StorageUnavailableError(f"Redis nonce store: {exc}") from exc


def _claim_database(name: str, ttl: float) -> bool:
    alias = executor.settings.DATABASE_ALIAS
    now = dt.datetime.now(dt.timezone.utc)
    _purge_expired(alias, now)
    rows = ReliableApiNonce.objects.using(alias)
    expires_at = now + dt.timedelta(seconds=ttl)
    for _ in range(2):
        try:
            with transaction.atomic(using=alias):
                rows.create(key=name, expires_at=expires_at)
            return True
        except IntegrityError:
            # Taken, unless only by an expired row the purge has not reached yet.
            if not rows.filter(key=name, expires_at__lte=now).delete()[0]:
                return False
    return False


def _purge_expired(alias: str, now: dt.datetime) -> None:
    """Delete expired rows, at most once every PURGE_EVERY seconds in this process."""
    global _last_purge
    with _purge_lock:
        if time.monotonic() - _last_purge < PURGE_EVERY and _last_purge:
            return
        _last_purge = time.monotonic()
    ReliableApiNonce.objects.using(alias).filter(expires_at__lte=now).delete()
