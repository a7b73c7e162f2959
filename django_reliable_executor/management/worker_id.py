"""The --worker-id check shared by runexecutor and `executor health` (no worker import)."""

from __future__ import annotations

from django.core.management.base import CommandError

from django_reliable_executor.core.ids import MAX_ID_LENGTH


def check_worker_id(worker_id: str | None) -> None:
    """A worker id is stored with each claim and in the worker registry: refuse at start one
    those columns cannot hold, rather than fail every claim and heartbeat later."""
    if worker_id is None:
        return
    if not 1 <= len(worker_id) <= MAX_ID_LENGTH:
        raise CommandError(
            f"--worker-id must be 1..{MAX_ID_LENGTH} characters, got {len(worker_id)}"
        )
    if any(char.isspace() or not char.isprintable() for char in worker_id):
        raise CommandError(f"--worker-id {worker_id!r} contains whitespace or a control character")
