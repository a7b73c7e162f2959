"""``manage.py executor index-parameters`` on Redis: the tasks stored before a key was made
searchable (SEARCHABLE_PARAMETERS) given their parameter index entries, a SCAN step at a time.

Redis keeps no index of every task in id order, so the walk goes over each shard's task hashes
with SCAN: its resume point (``IndexStep.last_task_id``, the command's ``--after``) is
``<shard>:<SCAN cursor>``, not a task id. SCAN returns every key that exists from start to end
of the walk at least once; a task submitted meanwhile has its entries already.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from typing import Any

from ...core.parameter_index import index_entries
from .access import RedisAccess, guarded
from .codec import text
from .parameter_index import index_arg

# Keys SCAN looks at per step and shard (COUNT): the tasks read are those among them.
INDEX_CHUNK = 1000


class IndexStep:
    """One step of ``index_parameters``: tasks read, entries written and deleted, and where
    the walk goes on (None: it is over)."""

    def __init__(self, tasks: int, written: int, deleted: int, last: str | None) -> None:
        self.tasks, self.written, self.deleted, self.last_task_id = tasks, written, deleted, last


class ParameterReindexing(RedisAccess):
    """index_parameters: one SCAN step over one shard's task hashes."""

    @guarded
    def index_parameters(
        self, keys: Collection[str], after: str | None = None, limit: int = INDEX_CHUNK
    ) -> IndexStep:
        """The task hashes of one SCAN step (COUNT ``limit``) from ``after`` (None: the first
        shard's start), each given the entries its parameter holds under ``keys``, those of
        other keys dropped (param_reindex.lua, which leaves a task whose parameter changed
        since it was read). Idempotent: a walk that stopped can start again anywhere."""
        shard, cursor = (0, 0) if after is None else (int(p) for p in after.split(":", 1))
        if not 0 <= shard < len(self.prefixes):
            raise ValueError(f"--after {after!r}: not a position this storage printed")
        prefix = self.prefixes[shard]
        cursor, found = self.client.scan(
            cursor, match=prefix + "t:*", count=limit, **self._node_of(prefix)
        )
        if isinstance(cursor, dict):  # a Cluster client's: per node, here the one node asked
            cursor = next(iter(cursor.values()), 0)
        ids = [text(key)[len(prefix) + 2 :] for key in found]
        written = deleted = 0
        if ids:
            pipe = self.client.pipeline(transaction=False)
            for task_id in ids:
                pipe.hmget(prefix + "t:" + task_id, "j", "px")
            args: list[str] = []
            changes = []
            for task_id, (j, px) in zip(ids, pipe.execute(), strict=True):
                if j is None:
                    continue  # purged meanwhile
                raw = text(j)
                wanted = index_arg(index_entries(json.loads(raw), keys))
                old = text(px) if px else ""
                if wanted != old:
                    digest = hashlib.sha1(raw.encode("utf-8"), usedforsecurity=False).hexdigest()
                    args += (task_id, digest, wanted)
                    changes.append((set(json.loads(wanted or "[]")), set(json.loads(old or "[]"))))
            if args:
                replies = self._run("param_reindex", *args, shard=shard)
                for (new, gone), done in zip(changes, replies, strict=True):
                    if done:
                        written, deleted = written + len(new - gone), deleted + len(gone - new)
        if cursor:
            last: str | None = f"{shard}:{cursor}"
        else:
            last = f"{shard + 1}:0" if shard + 1 < len(self.prefixes) else None
        return IndexStep(len(ids), written, deleted, last)

    def _node_of(self, prefix: str) -> dict[str, Any]:
        """SCAN's target on a Cluster: the node holding the shard's hash slot (no option on
        a plain client)."""
        get_node = getattr(self.client, "get_node_from_key", None)
        return {} if get_node is None else {"target_nodes": get_node(prefix)}
