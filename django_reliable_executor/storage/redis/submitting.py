"""Submitting to the Redis storage: batches of new tasks, each chunk one submit.lua call."""

from __future__ import annotations

from collections.abc import Sequence

from ...records import NewTask, TaskInfo, new_info
from .access import RedisAccess, guarded
from .codec import fields, submit_args, to_info

SUBMIT_CHUNK = 500  # tasks per submit script call: long enough to amortise, short enough not
# to hold Redis up (a script blocks every other client while it runs)


class Submitting(RedisAccess):
    """enqueue: existing ids returned unchanged, new ones stored and their queues woken."""

    @guarded
    def enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        results: list[tuple[TaskInfo, bool]] = []
        for start in range(0, len(tasks), SUBMIT_CHUNK):
            chunk = tasks[start : start + SUBMIT_CHUNK]
            args = [value for task in chunk for value in submit_args(task)]
            replies = self._run("submit", *args)
            for task, reply in zip(chunk, replies, strict=True):
                if reply == 1:
                    results.append((new_info(task), True))
                else:
                    results.append((to_info(task.task_id, fields(reply)), False))
        return results
