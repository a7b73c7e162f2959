"""Storage backends behind one interface; ``build_storage`` picks the one the settings name."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from ..conf import ExecutorSettings
from ..core.clock import Clock
from ..core.flow_limits import NO_FLOW_LIMITS, FlowLimits
from .base import TaskStorage
from .lock_names import MASTER_LOCK_NAME


def build_storage(
    settings: ExecutorSettings,
    clock: Clock | None = None,
    flow_limits: FlowLimits = NO_FLOW_LIMITS,
) -> TaskStorage:
    """A new storage object for ``settings``, told which task names are limited (the service
    passes the registry's ``FLOW_LIMITS``)."""
    if settings.STORAGE == "database":
        from .database import DatabaseStorage

        return DatabaseStorage(
            alias=settings.DATABASE_ALIAS,
            clock=clock,
            backoff_cap_millis=settings.DEFAULT_RETRY_BACKOFF_MAX,
            flow_limits=flow_limits,
        )
    if settings.STORAGE == "redis":
        from .redis import RedisStorage
        from .redis.connection import connect, describe

        return RedisStorage(
            connect(settings),
            settings.KEY_PREFIX,
            clock=clock,
            backoff_cap_millis=settings.DEFAULT_RETRY_BACKOFF_MAX,
            where=describe(settings),
            owns_client=settings.REDIS_CACHE_ALIAS is None,
            shards=settings.REDIS_SHARDS,
            flow_limits=flow_limits,
        )
    raise ImproperlyConfigured(
        f"RELIABLE_EXECUTOR['STORAGE'] = {settings.STORAGE!r} is not available in this version"
    )


__all__ = ["MASTER_LOCK_NAME", "TaskStorage", "build_storage"]
