"""``manage.py executor index-parameters`` on Redis: the tasks stored before a key was made
searchable (SEARCHABLE_PARAMETERS) given their parameter index entries, a SCAN step at a time.

Redis keeps no index of every task in id order, so the walk goes over each shard's task hashes
with SCAN: its resume point (``IndexStep.last_task_id``, the command's ``--after``) is
``<shard>:<SCAN cursor>:<run_id>``, not a task id (``<shard>:0`` at a shard's start). SCAN
returns every key that exists from start to end of the walk at least once, but only within one
server process: a cursor means nothing to another one (a restart, a failover, whose tables may
be laid out differently), where going on from it misses keys. So a position carries the
``run_id`` of the process that gave its cursor, and a shard whose server is not that process
any more (or changed during a step) is walked again from cursor 0. A task submitted meanwhile
has its entries already.
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
    """One step of ``index_parameters``: tasks read, entries written and deleted, where the
    walk goes on (None: it is over), and ``note``: why a shard's walk started again, if it
    did (None otherwise)."""

    def __init__(
        self, tasks: int, written: int, deleted: int, last: str | None, note: str | None = None
    ) -> None:
        self.tasks, self.written, self.deleted, self.last_task_id = tasks, written, deleted, last
        self.note = note


class ParameterReindexing(RedisAccess):
    """index_parameters: one SCAN step over one shard's task hashes."""

    @guarded
    def index_parameters(
        self, keys: Collection[str], after: str | None = None, limit: int = INDEX_CHUNK
    ) -> IndexStep:
        """The task hashes of one SCAN step (COUNT ``limit``) from ``after`` (None: the first
        shard's start), each given the entries its parameter holds under ``keys``, those of
        other keys dropped (param_reindex.lua, which leaves a task whose parameter changed
        since it was read). A cursor given by another server process than the shard's now
        (restarted, failed over), or with no run_id (an older version's ``<shard>:<cursor>``),
        is not used: the shard is walked again from cursor 0, and ``note`` says so; as it is
        when the process changed during the step. Idempotent: a walk that stopped can start
        again anywhere."""
        shard, cursor, given_by = self._position(after)
        prefix = self.prefixes[shard]
        node = self._node_of(prefix)
        run_id = self._run_id(node)
        note = None
        if cursor and given_by != run_id:
            # SCAN's promise (every key seen once) holds within one process only: another
            # one's table, rebuilt from the AOF or a replica's, may order keys differently.
            why = (
                f"names no server process ({after!r}, an older version's position)"
                if given_by is None
                else f"is Redis process {given_by}'s, the server is process {run_id} now "
                "(restarted or failed over)"
            )
            note = f"shard {shard}: its cursor {why}: walking shard {shard} again from the start"
            cursor = 0
        cursor, found = self.client.scan(cursor, match=prefix + "t:*", count=limit, **node)
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
        now = self._run_id(node)
        last: str | None
        if now != run_id:
            # Restarted during the step (the client's retry reconnecting hides it): the SCAN
            # may have been answered by the new process from the old one's cursor, and its
            # reply (a next cursor, or 0: the shard done) may have skipped keys.
            note = (
                f"shard {shard}: Redis process {run_id} was replaced by {now} during a step: "
                f"walking shard {shard} again from the start"
            )
            last = f"{shard}:0"
        elif cursor:
            last = f"{shard}:{cursor}:{run_id}"
        else:
            last = f"{shard + 1}:0" if shard + 1 < len(self.prefixes) else None
        return IndexStep(len(ids), written, deleted, last, note)

    def _position(self, after: str | None) -> tuple[int, int, str | None]:
        """``after`` read: shard, SCAN cursor and the run_id of the process that gave the
        cursor (None if the position has none: a shard's start, or an older version's
        ``<shard>:<cursor>``). ValueError if it is not a position this storage prints."""
        if after is None:
            return 0, 0, None
        parts = after.split(":")
        try:
            shard, cursor = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            shard = cursor = -1
        if len(parts) > 3 or not 0 <= shard < len(self.prefixes) or cursor < 0:
            raise ValueError(f"--after {after!r}: not a position this storage printed")
        return shard, cursor, parts[2] if len(parts) == 3 and parts[2] else None

    def _run_id(self, node: dict[str, Any]) -> str:
        """The run_id of the server process ``node`` (_node_of) reaches now: a new one at each
        start of the server, and another server's after a failover."""
        return str(self.client.info("server", **node)["run_id"])

    def _node_of(self, prefix: str) -> dict[str, Any]:
        """SCAN's target on a Cluster: the node holding the shard's hash slot (no option on
        a plain client)."""
        get_node = getattr(self.client, "get_node_from_key", None)
        return {} if get_node is None else {"target_nodes": get_node(prefix)}
