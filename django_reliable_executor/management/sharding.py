"""``manage.py executor shards N``: the check before changing REDIS_SHARDS, and the switch."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..conf import MAX_REDIS_SHARDS
from ..service.reliable_executor import executor
from .exit_codes import EXIT_INCOMPLETE, EXIT_USAGE


def _shard_count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_REDIS_SHARDS:
        raise argparse.ArgumentTypeError(
            f"invalid N {value!r}: expected a number of shards from 1 to {MAX_REDIS_SHARDS}"
        )
    return number


def add_shards(actions: Any) -> None:
    """``shards N``: may REDIS_SHARDS change to N now?"""
    shards = actions.add_parser(
        "shards",
        help="check that REDIS_SHARDS may change to N now (Redis storage)",
        description="Check, before changing REDIS_SHARDS (offline: stop submitting, drain, stop "
        "the workers), that the current layout holds no unfinished task and that the N-shard "
        "layout holds no key at all; print each queue's shard under N. Exit code 0 when the "
        "switch may be made, 1 when not.",
    )
    shards.add_argument("target", type=_shard_count, metavar="N")
    shards.add_argument(
        "--apply",
        action="store_true",
        help="when the switch may be made, make it: pause the paused queues in the N-shard "
        "layout too and record N as the key prefix's layout (workers with the old REDIS_SHARDS "
        "are then refused, those with N start)",
    )


class Sharding(BaseCommand):
    """The ``shards`` action of the ``executor`` command."""

    def shards(self, options: dict[str, Any]) -> None:
        from django_reliable_executor.storage.redis import RedisStorage
        from django_reliable_executor.storage.redis.resharding import (
            apply_reshard,
            check_reshard,
        )

        storage = executor.storage
        if not isinstance(storage, RedisStorage):
            raise CommandError(
                "shards: REDIS_SHARDS applies to the Redis storage only", returncode=EXIT_USAGE
            )
        try:
            check = (apply_reshard if options["apply"] else check_reshard)(
                storage, options["target"]
            )
        except ValueError as exc:
            raise CommandError(f"shards: {exc}", returncode=EXIT_USAGE) from None
        self.stdout.write(
            f"REDIS_SHARDS {check.current} -> {check.target} (key prefix {storage.key_prefix!r})"
        )
        for queue, shard in sorted(check.queue_shards.items()):
            self.stdout.write(f"  queue {queue}: shard {shard}")
        self.stdout.write(f"unfinished tasks: {check.unfinished}")
        self.stdout.write(
            f"schedules: {check.schedules} (not carried over: define them again after)"
        )
        paused = ", ".join(sorted(check.paused)) or "none"
        self.stdout.write(f"paused queues: {paused} (carried over)")
        for problem in check.problems():
            self.stdout.write(f"not ready: {problem}")
        if not check.ready:
            raise SystemExit(EXIT_INCOMPLETE)
        if options["apply"]:
            self.stdout.write(
                f"applied: the layout of key prefix {storage.key_prefix!r} is REDIS_SHARDS = "
                f"{check.target} now; set REDIS_SHARDS = {check.target}, then start the workers "
                "again"
            )
        else:
            self.stdout.write(
                f"ready: run again with --apply, then set REDIS_SHARDS = {check.target} and "
                "start the workers again"
            )
