"""Handlers' progress reports on the Redis storage: one script call for a batch (progress.lua)."""

from __future__ import annotations

from collections.abc import Sequence

from ...core.progress import Progress, progress_to_json
from ...core.records import Claim
from ...core.serialization import dumps
from .access import RedisAccess, guarded


class ProgressReports(RedisAccess):
    """record_progress: the ``pg`` field of each task hash, fenced by the claim's token."""

    @guarded
    def record_progress(self, reports: Sequence[tuple[Claim, Progress]]) -> int:
        if not reports:
            return 0
        # One script call per worker id (a worker reports only its own claims: one call).
        stored = 0
        by_worker: dict[tuple[int, str], list[object]] = {}
        for claim, progress in reports:
            by_worker.setdefault((claim.shard, claim.task.worker_id or ""), []).extend(
                (claim.task_id, claim.token, dumps(progress_to_json(progress)))
            )
        for (shard, worker_id), args in by_worker.items():
            stored += int(self._run("progress", worker_id, *args, shard=shard))
        return stored
