"""manage.py executor: status, show, retry, cancel and purge tasks, send events to them, pause
and resume queues; health; shards (the check before changing REDIS_SHARDS); index-parameters.

Every action goes through the service (so signals fire and both storages behave alike); the
exit codes and output lines are documented in docs/command.md for scripts to rely on. Each
family of actions, its arguments and its handlers, is a module of ``management``:
``inspecting`` (status, show, health), ``operating`` (retry, cancel, send-event,
pause-queue, resume-queue), ``purging`` (purge), ``sharding`` (shards) and ``indexing``
(index-parameters).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from django_reliable_executor.exceptions import (
    InvalidQueueError,
    StorageUnavailableError,
    UnknownQueueError,
)
from django_reliable_executor.management.exit_codes import (
    EXIT_INCOMPLETE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)
from django_reliable_executor.management.indexing import Indexing, add_index_parameters
from django_reliable_executor.management.inspecting import (
    Inspecting,
    add_health,
    add_show,
    add_status,
)
from django_reliable_executor.management.operating import (
    Operating,
    add_pause_and_resume,
    add_retry_and_cancel,
    add_send_event,
)
from django_reliable_executor.management.purging import Purging, add_purge
from django_reliable_executor.management.sharding import Sharding, add_shards
from django_reliable_executor.management.tables import tables_missing
from django_reliable_executor.service.reliable_executor import executor


def _accept_django_options(action: Any) -> None:
    """Django's own options after the action too (``executor status --settings X``), as every
    other command takes them anywhere: SUPPRESS keeps a value given before the action."""
    action.add_argument(
        "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=argparse.SUPPRESS
    )
    for name in ("--settings", "--pythonpath"):
        action.add_argument(name, default=argparse.SUPPRESS)
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        action.add_argument(flag, action="store_true", default=argparse.SUPPRESS)


class Command(Inspecting, Operating, Purging, Sharding, Indexing):
    help = (
        "Look at and operate reliable-executor tasks: status, show, retry, cancel, "
        "send-event, purge, "
        "pause-queue, resume-queue; health (a probe); shards (the check before changing "
        "REDIS_SHARDS); index-parameters (fill the parameter index of SEARCHABLE_PARAMETERS). "
        "Exit codes: 0 done, 1 some id not found or skipped (health: unhealthy; "
        "pause/resume: unknown queue; shards: not ready), 2 usage error, 3 task store "
        "unavailable."
    )
    stealth_options = ("stdin",)

    def get_check_kwargs(self, options: dict[str, Any]) -> Any:
        """Skip the database checks Django 6 runs before commands: an unreachable task store
        is this command's to report, with exit code 3, not a system-check failure."""
        kwargs = super().get_check_kwargs(options)  # Django 6.0+ only calls this
        kwargs["databases"] = []
        return kwargs

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
        add_status(actions)
        add_show(actions)
        add_retry_and_cancel(actions)
        add_send_event(actions)
        add_purge(actions)
        add_health(actions)
        add_pause_and_resume(actions)
        add_shards(actions)
        add_index_parameters(actions)
        for action in actions.choices.values():
            _accept_django_options(action)

    def handle(self, *args: Any, **options: Any) -> None:
        actions: dict[str, Callable[[dict[str, Any]], None]] = {
            "status": self.status,
            "show": self.show,
            "retry": self.retry,
            "cancel": self.cancel,
            "send-event": self.send_event,
            "purge": self.purge,
            "health": self.health,
            "pause-queue": self.pause_queue,
            "resume-queue": self.resume_queue,
            "shards": self.shards,
            "index-parameters": self.index_parameters,
        }
        try:
            actions[options["action"]](options)
        except UnknownQueueError as exc:
            raise CommandError(str(exc), returncode=EXIT_INCOMPLETE) from exc
        except InvalidQueueError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        except StorageUnavailableError as exc:
            raise CommandError(
                f"task store unavailable: {exc}", returncode=EXIT_UNAVAILABLE
            ) from exc
        except DatabaseError as exc:
            alias = executor.settings.DATABASE_ALIAS
            missing = tables_missing(executor.storage)
            if missing is not None:
                raise CommandError(missing, returncode=EXIT_UNAVAILABLE) from exc
            raise CommandError(
                f"task store unavailable (database {alias!r}): {type(exc).__name__}: {exc}",
                returncode=EXIT_UNAVAILABLE,
            ) from exc
