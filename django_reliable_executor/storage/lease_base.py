"""The storage interface's leases: named locks (the master lock, the chore locks of shards),
one-time nonces, and the registry of live workers. TaskStorage inherits it (storage/base.py
says which module of each backend holds each method)."""

from __future__ import annotations

import abc
import builtins
import datetime as dt
from collections.abc import Sequence

from ..core.records import WorkerInfo


class LeaseStorage(abc.ABC):
    """Named leases, nonces and the worker registry of a storage."""

    @abc.abstractmethod
    def acquire_lock(self, name: str, owner: str, ttl_seconds: float) -> bool:
        """Take or renew the named lease for ``owner``; False while someone else holds it."""

    @abc.abstractmethod
    def release_lock(self, name: str, owner: str) -> None:
        """Give the lease up if ``owner`` holds it."""

    @abc.abstractmethod
    def lock_owner(self, name: str) -> str | None:
        """Who holds the named lease now, or None."""

    def lock_owners(self, names: Sequence[str]) -> dict[str, str | None]:
        """lock_owner of each name."""
        return {name: self.lock_owner(name) for name in names}

    @abc.abstractmethod
    def spend_nonce(self, name: str, ttl_seconds: float) -> bool:
        """Remember the one-time ``name`` for ``ttl_seconds``; False if it is already
        remembered (a replayed signed request: api/nonces.py)."""

    @abc.abstractmethod
    def worker_seen(self, worker_id: str, info: dict[str, object]) -> None:
        """Record that a worker is alive (its heartbeat)."""

    @abc.abstractmethod
    def worker_gone(self, worker_id: str) -> None:
        """Forget a worker that stopped cleanly."""

    @abc.abstractmethod
    def workers(self) -> builtins.list[WorkerInfo]:
        """The workers seen recently and not yet forgotten, by worker id."""

    def worker_last_seen(self, worker_id: str) -> dt.datetime | None:
        """When ``worker_id`` last heartbeated, or None when it is not registered (never seen,
        stopped cleanly, or forgotten after a long silence). The shipped storages read that one
        worker; this default reads them all."""
        for worker in self.workers():
            if worker.worker_id == worker_id:
                return worker.last_seen_at
        return None

    @abc.abstractmethod
    def forget_workers(self, seen_before: dt.datetime) -> int:
        """Forget workers whose last heartbeat is older than ``seen_before`` (they died)."""
