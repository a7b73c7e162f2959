"""``manage.py executor purge``: delete finished tasks (and the batches finished as long ago),
after a confirmation, with a progress line on a terminal."""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..core.states import TERMINAL_STATUSES, TaskStatus
from ..service.reliable_executor import executor
from .exit_codes import EXIT_INCOMPLETE, EXIT_INTERRUPTED, EXIT_USAGE
from .output import DURATION_EXAMPLES, format_age, parse_duration

# Lifecycle order, not alphabetical, like every other list of statuses in the docs.
FINISHED = [status for status in TaskStatus if status in TERMINAL_STATUSES]
FINISHED_NAMES = ", ".join(status.value for status in FINISHED)


def _duration(value: str) -> Any:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _finished_status(value: str) -> TaskStatus:
    try:
        status = TaskStatus(value.strip().upper())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"unknown status {value!r}: expected one of {FINISHED_NAMES}"
        ) from None
    if status not in TERMINAL_STATUSES:
        raise argparse.ArgumentTypeError(
            f"{status.value} is not a finished status: purge deletes only {FINISHED_NAMES} "
            "tasks (live tasks are never purged)"
        )
    return status


def positive_int(what: str) -> Callable[[str], int]:
    """An argparse ``type`` taking an integer >= 1; its error names ``what`` ("batch size")."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            raise argparse.ArgumentTypeError(f"invalid {what} {value!r}: expected an integer >= 1")
        return number

    return parse


def add_purge(actions: Any) -> None:
    """``purge --older-than``: delete finished tasks."""
    purge = actions.add_parser(
        "purge",
        help="delete finished tasks older than a duration",
        description="Delete finished tasks (by default of every finished status) whose "
        "finished_at is older than --older-than. Running and waiting tasks are never "
        "deleted.",
    )
    purge.add_argument(
        "--older-than",
        type=_duration,
        required=True,
        metavar="DURATION",
        help=f"how long ago they finished, e.g. {DURATION_EXAMPLES}",
    )
    purge.add_argument(
        "--status",
        type=_finished_status,
        nargs="+",
        action="extend",
        dest="statuses",
        metavar="STATUS",
        help=f"only tasks of these statuses (any of {FINISHED_NAMES}; default all)",
    )
    purge.add_argument(
        "--yes",
        "--no-input",
        "--noinput",
        action="store_true",
        dest="yes",
        help="do not ask for confirmation (required when stdin is not a terminal)",
    )
    purge.add_argument(
        "--batch-size",
        type=positive_int("batch size"),
        default=500,
        metavar="N",
        help="tasks deleted per round (default 500)",
    )
    purge.add_argument(
        "--pause",
        type=_pause,
        default=0.0,
        metavar="SECONDS",
        help="wait this long between rounds, to pace a large purge (default 0)",
    )


def _pause(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 <= seconds <= 3600):
        raise argparse.ArgumentTypeError(
            f"invalid --pause {value!r}: expected a number of seconds from 0 to 3600"
        )
    return seconds


class Purging(BaseCommand):
    """The ``purge`` action of the ``executor`` command."""

    def purge(self, options: dict[str, Any]) -> None:
        statuses: list[TaskStatus] = list(dict.fromkeys(options["statuses"] or FINISHED))
        cutoff = executor.clock.now() - options["older_than"]
        names = ", ".join(status.value for status in statuses)
        if not options["yes"] and not self._confirmed(
            f"Delete {names} tasks finished before {cutoff.isoformat()}? [y/N] ",
            options.get("stdin") or sys.stdin,
        ):
            raise CommandError("purge not confirmed: nothing deleted", returncode=EXIT_INCOMPLETE)
        draw = self._progress_line() if self.stderr.isatty() else None
        so_far = [0]

        def progress(deleted: int) -> None:
            so_far[0] = deleted
            if draw is not None:
                draw(deleted)

        try:
            deleted = executor.purge_finished(
                cutoff,
                statuses=statuses,
                batch=options["batch_size"],
                progress=progress,
                pause_seconds=options["pause"],
            )
            # Every finished task is gone: the batches that finished as long ago go too (with
            # --status, some of their members are kept: so are they).
            every = set(statuses) == set(FINISHED)
            batches = (
                executor.purge_batches(
                    cutoff, batch=options["batch_size"], pause_seconds=options["pause"]
                )
                if every
                else 0
            )
        except KeyboardInterrupt:
            # Every finished batch is deleted for good; say how many, not a traceback.
            if draw is not None:
                self.stderr.write("", style_func=_plain)
            raise CommandError(
                f"interrupted: purged {so_far[0]} tasks finished before {cutoff.isoformat()}",
                returncode=EXIT_INTERRUPTED,
            ) from None
        if draw is not None:
            self.stderr.write("", style_func=_plain)  # end the progress line
        if every:
            self.stdout.write(f"purged {batches} batches finished before {cutoff.isoformat()}")
        self.stdout.write(f"purged {deleted} tasks finished before {cutoff.isoformat()}")

    def _confirmed(self, question: str, stdin: Any) -> bool:
        if not (hasattr(stdin, "isatty") and stdin.isatty()):
            raise CommandError(
                "purge deletes tasks: pass --yes to confirm when stdin is not a terminal",
                returncode=EXIT_USAGE,
            )
        self.stderr.write(question, ending="", style_func=_plain)
        self.stderr.flush()
        return stdin.readline().strip().lower() in ("y", "yes")

    def _progress_line(self) -> Callable[[int], None]:
        """``progress`` for purge_finished: one line on the terminal, rewritten per batch.
        The total is not known up front, so it counts and shows the rate."""
        started = time.monotonic()

        def show(deleted: int) -> None:
            elapsed = time.monotonic() - started
            rate = f", {deleted / elapsed:,.0f}/s" if elapsed > 0 else ""
            self.stderr.write(
                f"\r\033[Kpurging: {deleted:,} deleted in {format_age(elapsed)}{rate}",
                ending="",
                style_func=_plain,
            )
            self.stderr.flush()

        return show


def _plain(text: str) -> str:
    """No error colour for what is not an error (Django colours all of stderr on a TTY)."""
    return text
