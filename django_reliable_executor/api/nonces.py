"""One-time nonces of signed requests, kept in the executor's own store until they expire."""

from __future__ import annotations

from ..service.reliable_executor import executor


def claim(key_id: str, nonce: str, ttl: float) -> bool:
    """Remember ``nonce`` of ``key_id`` for ``ttl`` seconds; False if it is already remembered."""
    return executor.storage.spend_nonce(f"{key_id}:{nonce}", ttl)
