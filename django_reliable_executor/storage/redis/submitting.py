"""Submitting to the Redis storage: batches of new tasks, each chunk one submit.lua call."""

from __future__ import annotations

import operator
from collections.abc import Sequence

from ...dependencies import WAITING_RUN_AT, missing_error
from ...records import NewTask, TaskInfo, copy_with, new_info
from ...serialization import dumps
from ...states import LIVE_STATUSES
from .access import RedisAccess, guarded
from .codec import fields, from_micros, micros, submit_args, text, to_info

QUEUE = operator.attrgetter("queue")
SUBMIT_CHUNK = 500  # tasks per submit script call: long enough to amortise, short enough not
# to hold Redis up (a script blocks every other client while it runs)


class Submitting(RedisAccess):
    """enqueue: existing ids (and live holders of unique keys) returned unchanged, new ones
    stored and their queues woken."""

    @guarded
    def enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        # Each task goes to its queue's shard; dependencies are looked up there only (the
        # cross-shard links of docs/sharding-design.md are not built yet).
        return self._each_shard(tasks, QUEUE, self._enqueue_on)

    def _enqueue_on(self, tasks: Sequence[NewTask], shard: int) -> list[tuple[TaskInfo, bool]]:
        results: list[tuple[TaskInfo, bool]] = []
        # A batch with dependents is one call: all or nothing (a missing dependency).
        size = len(tasks) if any(task.depends_on for task in tasks) else SUBMIT_CHUNK
        for start in range(0, len(tasks), size):
            chunk = tasks[start : start + size]
            args = [value for task in chunk for value in _args(task)]
            replies = self._run("submit", *args, shard=shard)
            if (
                replies
                and not isinstance(replies[0], (int, list))
                and text(replies[0]) == "missing"
            ):
                raise missing_error(text(replies[1]), [text(replies[2])])
            for task, reply in zip(chunk, replies, strict=True):
                if reply == 1:
                    results.append((new_info(task), True))
                elif len(reply) == 2 and isinstance(reply[0], list):  # a new dependent
                    results.append((to_info(task.task_id, fields(reply[0])), True))
                elif len(reply) == 2 and isinstance(reply[1], list):  # a unique key's holder
                    results.append((to_info(text(reply[0]), fields(reply[1])), False))
                else:
                    results.append((to_info(task.task_id, fields(reply)), False))
        return results

    @guarded
    def unique_holder(self, unique_key: str) -> TaskInfo | None:
        if self.sharded:  # the key is kept on the shard of its holder's queue
            pipe = self.client.pipeline(transaction=False)
            for prefix in self.prefixes:
                pipe.get(prefix + "u:" + unique_key)
            held = next((value for value in pipe.execute() if value is not None), None)
        else:
            held = self.client.get(self.p + "u:" + unique_key)
        if held is None:
            return None
        until, task_id = text(held).split(" ", 1)
        if from_micros(until) <= self.clock.now():
            return None
        holder = self.get(task_id)
        return holder if holder is not None and holder.status in LIVE_STATUSES else None


def _args(task: NewTask) -> list[str]:
    """Every value submit.lua takes for ``task``: submit_args, the unique key's 2, then its
    dependencies (JSON) and on-failure policy (a dependent is stored waiting: no run at, no
    deadline yet)."""
    if not task.depends_on:
        return [*submit_args(task), *_unique(task), "", ""]
    waiting = copy_with(task, run_at=WAITING_RUN_AT, deadline_at=None)
    policy = "run" if task.on_dependency_failure == "run" else ""
    return [*submit_args(waiting), *_unique(task), dumps(list(task.depends_on)), policy]


def _unique(task: NewTask) -> tuple[str, str]:
    """The 2 values submit.lua takes per task after submit_args: key digest, window end."""
    if task.unique_key is None or task.unique_until is None:
        return ("", "")
    return (task.unique_key, micros(task.unique_until))
