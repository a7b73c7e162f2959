"""``manage.py executor index-parameters``: give the tasks stored before a key was made
searchable (setting SEARCHABLE_PARAMETERS) their parameter index rows, in steps."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..service.reliable_executor import executor
from .exit_codes import EXIT_INTERRUPTED, EXIT_USAGE
from .purging import positive_int


def add_index_parameters(actions: Any) -> None:
    """``index-parameters``: fill the parameter index for the current setting."""
    action = actions.add_parser(
        "index-parameters",
        help="give stored tasks the parameter index entries of SEARCHABLE_PARAMETERS",
        description="Walk every stored task, --chunk at a time, each step one short "
        "transaction (a script on Redis): write the parameter index entries of the keys "
        "SEARCHABLE_PARAMETERS names that a task lacks (tasks stored before the key was "
        "added), and delete those of keys it no longer names. Idempotent: run it again, or "
        "from the last position it printed (--after: a task id on the databases, "
        "<shard>:<cursor>:<run id> on Redis, where a cursor holds for that server process "
        "only: after a restart or failover the shard is walked again from its start), after "
        "an interruption. PostgreSQL needs none (its GIN index covers every key).",
    )
    action.add_argument(
        "--chunk",
        type=positive_int("chunk size"),
        default=1000,
        help="tasks per step (default 1000)",
    )
    action.add_argument(
        "--after",
        metavar="POSITION",
        help="start after this position, as the last walk printed it (a task id; on Redis "
        "<shard>:<cursor>:<run id>)",
    )


class Indexing(BaseCommand):
    """The ``index-parameters`` action of the ``executor`` command."""

    def index_parameters(self, options: dict[str, Any]) -> None:
        storage = executor.storage
        index = getattr(storage, "index_parameters", None)
        if index is None:
            raise CommandError(
                "index-parameters: this storage keeps no parameter index to fill",
                returncode=EXIT_USAGE,
            )
        if not getattr(storage, "keeps_parameter_index", True):
            self.stdout.write(
                "nothing to fill: this database answers parameter searches from its own index "
                "of every parameter (PostgreSQL's GIN index)"
            )
            return
        keys = executor.settings.SEARCHABLE_PARAMETERS
        names = ", ".join(keys) if keys else "none (every index row is deleted)"
        self.stdout.write(f"searchable parameters: {names}")
        after, tasks, written, deleted = options["after"], 0, 0, 0
        try:
            while True:
                step = index(keys, after, options["chunk"])
                if step.note:  # Redis: why a shard's walk started again
                    self.stdout.write(step.note)
                tasks, written, deleted = (
                    tasks + step.tasks,
                    written + step.written,
                    deleted + step.deleted,
                )
                if step.last_task_id is None:
                    break
                after = step.last_task_id
                if options.get("verbosity", 1) >= 2:
                    self.stdout.write(f"  {tasks} tasks, up to {after}")
        except KeyboardInterrupt:
            resume = "" if after is None else f" with --after {after!r}"
            self.stdout.write(f"interrupted after {tasks} tasks: run again{resume} to go on")
            raise CommandError("interrupted", returncode=EXIT_INTERRUPTED) from None
        self.stdout.write(f"{tasks} tasks read: {written} index rows written, {deleted} deleted")
