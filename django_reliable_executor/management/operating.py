"""``manage.py executor`` retry, cancel, pause-queue and resume-queue: act on tasks and queues
through the service, one line per task or queue."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ..core.states import FAILURE_STATUSES, TaskStatus
from ..core.steps import check_step_name
from ..exceptions import UnknownStepError
from ..service.reliable_executor import executor
from .exit_codes import EXIT_INCOMPLETE, EXIT_USAGE


def add_retry_and_cancel(actions: Any) -> None:
    """``retry``/``cancel`` by ids; ``retry --failed``: every dead letter."""
    for name, verb in (("retry", "Retry"), ("cancel", "Cancel")):
        sub = actions.add_parser(
            name,
            help=f"{name} tasks by id",
            description=f"{verb} each task, one line per id, then a summary line. "
            "Exit code 0 when every task changed, 1 when any was skipped or not found.",
        )
        sub.add_argument("task_ids", nargs="+" if name == "cancel" else "*", metavar="task_id")
    retry = actions.choices["retry"]
    retry.add_argument(
        "--failed",
        action="store_true",
        help="instead of ids: every task that ended FAILED, TIMEOUT or ERROR (the dead "
        "letters), narrowed by --queue and --task-name",
    )
    retry.add_argument("--queue", default=None, help="with --failed: only this queue")
    retry.add_argument("--task-name", default=None, help="with --failed: only this task name")
    retry.add_argument(
        "--from-step",
        default=None,
        metavar="NAME",
        help="with ids: discard the checkpoint of this durable step and of the steps that "
        "finished after it, then retry (a task without that checkpoint is skipped, unchanged)",
    )


def add_send_event(actions: Any) -> None:
    """``send-event TASK_ID NAME [--payload JSON]``."""
    sub = actions.add_parser(
        "send-event",
        help="send an event to a task (context.wait_for_event)",
        description="Send event NAME to a task: its context.wait_for_event(NAME) returns the "
        "payload, and a task waiting for it resumes. The first payload sent under a name is "
        "kept. Exit code 1 when the task is not found or has ended, 2 for a name or payload "
        "that cannot be one.",
    )
    sub.add_argument("task_id")
    sub.add_argument("name")
    sub.add_argument(
        "--payload", default=None, metavar="JSON", help="the payload, as JSON (default: null)"
    )


def add_pause_and_resume(actions: Any) -> None:
    """``pause-queue NAME`` / ``resume-queue NAME``."""
    for name, verb, what in (
        ("pause-queue", "Pause", "no worker claims its tasks until resumed"),
        ("resume-queue", "Resume", "workers claim its tasks again"),
    ):
        sub = actions.add_parser(
            name,
            help=f"{verb.lower()} a queue: {what}",
            description=f"{verb} a queue: {what}. Doing it twice is no error. Exit code 1 for "
            "a queue nothing uses, 2 for a name no queue can have.",
        )
        sub.add_argument("queue")


class Operating(BaseCommand):
    """The actions of the ``executor`` command that retry, cancel, pause and resume."""

    # -- retry and cancel -----------------------------------------------------------------
    def retry(self, options: dict[str, Any]) -> None:
        task_ids = options["task_ids"]
        if options["failed"] == bool(task_ids):
            raise CommandError("retry: give task ids or --failed (not both)", returncode=EXIT_USAGE)
        if not options["failed"] and (options["queue"] or options["task_name"]):
            raise CommandError(
                "retry: --queue and --task-name only narrow --failed", returncode=EXIT_USAGE
            )
        from_step = options["from_step"]
        if from_step is not None:
            if options["failed"]:
                # Each dead letter's steps are its own: name the tasks to rewind.
                raise CommandError(
                    "retry: --from-step takes task ids, not --failed", returncode=EXIT_USAGE
                )
            try:
                check_step_name(from_step, "--from-step")
            except ValueError as exc:
                raise CommandError(f"retry: {exc}", returncode=EXIT_USAGE) from exc
        if options["failed"]:
            task_ids = self._dead_letters(options["queue"], options["task_name"])
        self._each(task_ids, functools.partial(self._retry_one, from_step=from_step))

    @staticmethod
    def _dead_letters(queue: str | None, task_name: str | None) -> list[str]:
        """Ids of every FAILED, TIMEOUT and ERROR task (filtered), read before any is retried:
        a retry moves a task out of these statuses, which would shift the pages."""
        ids: list[str] = []
        for status in sorted(FAILURE_STATUSES, key=lambda s: s.value):
            offset = 0
            while True:
                page = executor.list_tasks(
                    status=status, queue=queue, task_name=task_name, limit=500, offset=offset
                )
                ids += [task.task_id for task in page]
                if len(page) < 500:
                    break
                offset += len(page)
        return ids

    def cancel(self, options: dict[str, Any]) -> None:
        self._each(options["task_ids"], self._cancel_one)

    def _each(self, task_ids: list[str], act: Callable[[str], tuple[str, str]]) -> None:
        """Run ``act`` on every id once (in the order given), print ``<id>: <outcome>`` for
        each, then the summary; exit 1 unless every task changed."""
        tally = {"changed": 0, "skipped": 0, "not found": 0}
        for task_id in dict.fromkeys(task_ids):  # an id given twice is acted on once
            kind, outcome = act(task_id)
            tally[kind] += 1
            self.stdout.write(f"{task_id}: {outcome}")
        summary = ", ".join(f"{n} {kind}" for kind, n in tally.items())
        self.stdout.write(summary)
        if tally["skipped"] or tally["not found"]:
            raise CommandError(f"not every task changed ({summary})", returncode=EXIT_INCOMPLETE)

    @staticmethod
    def _retry_one(task_id: str, from_step: str | None = None) -> tuple[str, str]:
        if executor.get_task(task_id) is None:
            return "not found", "not found"
        try:
            reason = executor.retry_task_or_reason(task_id, from_step)
        except UnknownStepError as exc:
            return "skipped", f"skipped: {exc}"
        if reason is None:
            return "changed", "retried" if from_step is None else f"retried from step {from_step!r}"
        if reason == "not found":
            return "not found", "not found"
        return "skipped", f"skipped: {reason}"

    @staticmethod
    def _cancel_one(task_id: str) -> tuple[str, str]:
        if executor.get_task(task_id) is None:
            return "not found", "not found"
        changed = executor.cancel_task(task_id)
        now = executor.get_task(task_id)
        if now is None:
            return "not found", "not found"
        if not changed:
            return "skipped", f"skipped: {now.status.value} cannot be cancelled"
        # A changed cancel either ended the task or, while it runs, only set the flag.
        if now.status is TaskStatus.CANCELLED:
            return "changed", "cancelled"
        return "changed", "cancel requested (running)"

    # -- events ---------------------------------------------------------------------------
    def send_event(self, options: dict[str, Any]) -> None:
        task_id, name, text = options["task_id"], options["name"], options["payload"]
        try:
            payload = None if text is None else json.loads(text)
        except ValueError as exc:
            raise CommandError(
                f"send-event: --payload is not JSON: {exc}", returncode=EXIT_USAGE
            ) from None
        if executor.get_task(task_id) is None:
            raise CommandError(f"task {task_id!r} not found", returncode=EXIT_INCOMPLETE)
        try:
            sent = executor.send_event(task_id, name, payload)
        except (TypeError, ValueError) as exc:
            raise CommandError(f"send-event: {exc}", returncode=EXIT_USAGE) from None
        if not sent:
            raise CommandError(
                f"task {task_id!r} has ended: event {name!r} not sent", returncode=EXIT_INCOMPLETE
            )
        self.stdout.write(f"{task_id}: event {name!r} sent")

    # -- paused queues --------------------------------------------------------------------
    def pause_queue(self, options: dict[str, Any]) -> None:
        queue = options["queue"]
        if executor.pause_queue(queue):
            self.stdout.write(f"paused queue {queue}")
        else:
            self.stdout.write(f"queue {queue} was paused already")

    def resume_queue(self, options: dict[str, Any]) -> None:
        queue = options["queue"]
        if executor.resume_queue(queue):
            self.stdout.write(f"resumed queue {queue}")
        else:
            self.stdout.write(f"queue {queue} was not paused")
