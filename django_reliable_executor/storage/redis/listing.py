"""list_tasks on the Redis storage: newest first, without an index of every task by creation.

Finished tasks are listed from their status's ``done:<STATUS>`` index, scored by creation time,
so a page of them costs a range read whatever their number. Unfinished tasks are read from the
indexes they wait in (ready lists and fair sets, schedules, leases) and sorted here: exactly
while there are up to EXACT_UNFINISHED of them; beyond that, only the newest ``offset + limit``
arrivals of each ready list and schedule (the highest rounds of each fair set), so a page costs
the same with a backlog of a million (in arrival order, which is creation order except for
retries and delayed tasks). An index of every task by creation time would cost more memory per
queued task than the task itself.

A batch's members (``batch_id=``) are listed from its member index instead, one group per
status, LIVE for the unfinished (lua/_batches.lua): a page costs a range read of each group
wanted, whatever the number of tasks; CREATED, PENDING or RUNNING alone reads the batch's LIVE
group down to the page's matches.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import json
from collections.abc import Collection, Sequence
from typing import cast

from ...core.parameter_filter import TaskPage, matches
from ...core.queries import TaskQuery
from ...core.records import StepInfo, TaskInfo, copy_with
from ...core.states import LIVE_STATUSES, TERMINAL_STATUSES, TaskStatus
from ...core.task_count import TaskCount
from .access import LIVE, READ_CHUNK, WAITING, RedisAccess, guarded
from .codec import fair_member, key_bucket, micros, text, to_info
from .parameter_index import entry_key
from .parameter_scan import SCAN_LIMIT, SERVER_SCAN_LIMIT, Scan
from .sharding import CONTROL_SHARD

# Up to this many unfinished tasks, listings that include them are exact (each is read and
# sorted); beyond it, only the newest arrivals of each ready list and schedule are read.
EXACT_UNFINISHED = 10_000
Row = tuple[int, str]  # (created in microseconds, task id): sorted descending = newest first
# The groups of a batch's member index (lua/_batches.lua) and the statuses each holds.
BATCH_GROUPS: dict[str, set[TaskStatus]] = {"LIVE": set(LIVE_STATUSES)}
BATCH_GROUPS.update({status.value: {status} for status in TERMINAL_STATUSES})
ANY_SHARD = -1  # _matching: each task on whichever shard holds it
# The index entries a count reads at most, so that the admin's count stays bounded: each costs
# a task's fields read by the client (about 0.1 ms on a busy two-core machine, mostly redis-py
# packing the HMGET: docs/benchmarks.md#bulk-action-counts).
COUNT_SCAN_LIMIT = 20_000
UNBOUNDED = 2**62  # the scan of a search the parameter index answers: read to the set's end
# Index entries one index_match call checks: about 5 ms of the server's time, so that other
# clients wait no longer than that behind a count.
SERVER_CHUNK = 5_000


class Listing(RedisAccess):
    """list(): merge pages of the done indexes with the unfinished tasks."""

    @guarded
    def _list(self, query: TaskQuery) -> list[TaskInfo]:
        scan = Scan(left=SCAN_LIMIT)  # a parameter search's bound (parameter_scan.py)
        page = self._page(query, scan)
        return TaskPage(page) if scan.cut_short else page

    @guarded
    def _count_tasks(
        self, query: TaskQuery, cap: int, since: dt.datetime | None, until: dt.datetime | None
    ) -> TaskCount:
        """The rows a listing of ``cap`` tasks at offset 0 reads (each index walked once, down
        to its ``cap`` newest matches), counted in the window; read again, further, only while
        tasks newer than ``until`` took places among them. At most COUNT_SCAN_LIMIT index
        entries are read (each a task's fields where no index answers the filter, a task
        name's say): past them the count is incomplete."""
        low = None if since is None else int(micros(since))
        high = None if until is None else int(micros(until))
        end = cap
        while True:
            scan = Scan(left=COUNT_SCAN_LIMIT, bounded=True, server_left=SERVER_SCAN_LIMIT)
            found = self._count_rows(dataclasses.replace(query, limit=end, offset=0), scan)
            rows = sorted(found, reverse=True)[:end]  # each index's newest: exact down to end
            newer = sum(high is not None and c > high for c, _ in rows)
            n = sum((low is None or c >= low) and (high is None or c <= high) for c, _ in rows)
            if n >= cap:
                return TaskCount(cap, complete=False)
            if len(rows) < end or (low is not None and rows[-1][0] < low):
                return TaskCount(n, complete=not scan.cut_short)  # the window read whole
            end = cap + newer  # > end: rows holds end tasks, under cap of them in the window

    def _count_rows(self, query: TaskQuery, scan: Scan) -> set[Row]:
        """The rows ``_page`` cuts a page of ``query`` from, as (created, task id)."""
        if query.indexed:  # the parameter index's sets (_indexed_rows): never cut short
            every = range(len(self.prefixes))
            return {row for shard in every for row in self._indexed_rows(query, shard)}
        if query.batch_id is not None:
            found = self._batch_rows(query.batch_id, query, scan)
            if found is not None:
                return set(found)
        if query.tag is not None:
            shards: Sequence[int] = range(len(self.prefixes))
            return {row for shard in shards for row in self._tagged_rows(query, shard, scan)}
        if query.queue is not None:
            shards = self._queue_shards(query.queue)
        else:
            shards = range(len(self.prefixes))
        return {row for shard in shards for row in self._all_rows(query, shard, scan)}

    def _page(self, query: TaskQuery, scan: Scan) -> list[TaskInfo]:
        rows: set[tuple[int, str, int]] | None = None
        if query.indexed:
            # A search the parameter index answers: the smallest of its sets on each shard
            # (every task is in its entries' sets on its own shard), read whole if need be.
            rows = {
                (c, i, shard)
                for shard in range(len(self.prefixes))
                for c, i in self._indexed_rows(query, shard)
            }
        if rows is None and query.batch_id is not None:
            # A batch and its member index live on the control shard (batches.py); sharded,
            # its members and callbacks on their queues' shards.
            found_rows = self._batch_rows(query.batch_id, query, scan)
            if found_rows is not None and self.sharded:
                page_ids = [i for _, i in sorted(set(found_rows), reverse=True)]
                infos = self.get_many(page_ids[query.offset : query.end])
                return [infos[i] for i in page_ids[query.offset : query.end] if i in infos]
            if found_rows is not None:
                rows = {(c, i, CONTROL_SHARD) for c, i in found_rows}
        if rows is None and query.tag is not None:
            # The tag's set on each shard (every task is in its tags' sets on its own shard).
            rows = {
                (c, i, shard)
                for shard in range(len(self.prefixes))
                for c, i in self._tagged_rows(query, shard, scan)
            }
        if rows is None:
            # Each shard's newest ``query.end`` rows, merged: the page is among them.
            if query.queue is not None:  # its shard, and the limited names' home shards
                shards: Sequence[int] = self._queue_shards(query.queue)
            else:
                shards = range(len(self.prefixes))
            rows = {
                (c, i, shard) for shard in shards for c, i in self._all_rows(query, shard, scan)
            }
        # A task that changed status between two reads may show up twice: keep it once.
        page = sorted(rows, reverse=True)[query.offset : query.end]
        found: dict[str, dict[str, str]] = {}
        steps: dict[str, tuple[StepInfo, ...]] = {}
        for shard in sorted({shard for _, _, shard in page}):
            here = self._read_many([i for _, i, s in page if s == shard], shard=shard)
            found.update(here)
            steps.update(self._steps_of(here, shard))  # of the tasks that stored any
        return [
            copy_with(to_info(task_id, found[task_id]), steps=steps[task_id])
            if task_id in steps
            else to_info(task_id, found[task_id])
            for _, task_id, _ in page
            if task_id in found
        ]

    def _all_rows(self, query: TaskQuery, shard: int, scan: Scan) -> builtins.list[Row]:
        """The rows of one shard the page is cut from, read from the indexes of every task."""
        wanted, queue = query.statuses, query.queue
        rows: builtins.list[Row] = []
        live = frozenset(LIVE) if wanted is None else frozenset(LIVE) & {s.value for s in wanted}
        if live:
            unfinished = self._unfinished_count(queue, shard)
            big = unfinished > EXACT_UNFINISHED
            # A parameter search reads further, its matches rare among them: a share of its
            # bound from each ready list and schedule.
            reach = query.end if query.parameter is None else max(query.end, scan.left // 4)
            newest = reach if big else None
            ids = sorted(self._unfinished_ids(live, queue, newest, shard))
            found = self._matching(ids, live, query, shard)
            if query.parameter is not None or scan.bounded:
                scan.left -= len(ids)
                scan.cut_short |= big and unfinished > len(ids) and len(found) < query.end
            rows += found
        # Each finished status's index is read only down to the ``query.end`` newest matches,
        # then merged here: a page of dead letters (FAILED + TIMEOUT + ERROR) reads at most
        # that many entries of each, never a whole index nor a union stored server side.
        finished = TERMINAL_STATUSES if wanted is None else wanted & TERMINAL_STATUSES
        for done in sorted(finished, key=lambda s: s.value):
            rows += self._newest_done(done, query, shard, scan)
        return rows

    def _batch_rows(self, batch_id: str, query: TaskQuery, scan: Scan) -> builtins.list[Row] | None:
        """The rows of a batch's members from its member index (lua/_batches.lua), down to the
        ``query.end`` newest matches of each group read, and of its callbacks; None when the
        batch is not stored (purged: members left over are found through every task)."""
        callbacks = self.client.hget(self.p + "b:" + batch_id, "cb")
        if callbacks is None:
            return None
        wanted = set(TaskStatus) if query.statuses is None else set(query.statuses)
        rows: builtins.list[Row] = []
        shard = ANY_SHARD if self.sharded else CONTROL_SHARD  # members of any shard's queues
        for group, statuses in BATCH_GROUPS.items():
            accept = {status.value for status in statuses & wanted}
            if accept:
                key = f"{self.p}bm:{batch_id}:{group}"
                exact = statuses <= wanted
                rows += self._newest_of(key, accept, query, shard, exact=exact, scan=scan)
        ids = [plain["task_id"] for plain in json.loads(text(callbacks)).values() if plain]
        return rows + self._matching(ids, {status.value for status in wanted}, query, shard)

    def _tagged_rows(self, query: TaskQuery, shard: int, scan: Scan) -> builtins.list[Row]:
        """The ``query.end`` newest tasks of the tag's set (``tag:<tag>``, scored by creation)
        on one shard that match the query."""
        key = self.prefixes[shard] + "tag:" + cast(str, query.tag)
        wanted = TaskStatus if query.statuses is None else query.statuses
        accept = {s.value for s in wanted}
        if query.parameter is None and query.batch_id is None and not query.by_origin:
            # Every task of the set has the tag: the server checks the rest.
            return self._newest_on_server(key, accept, query, shard, scan)
        return self._newest_of(key, accept, query, shard, exact=False, scan=scan)

    def _indexed_rows(self, query: TaskQuery, shard: int) -> builtins.list[Row]:
        """The ``query.end`` newest tasks on one shard that match the query, read from the
        smallest of the sets of its indexed entries (parameter_index.py) and of its tag, newest
        first: each task's filters and every pair are checked, and no bound stops the read."""
        prefix = self.prefixes[shard]
        keys = [entry_key(prefix, key, value) for key, value in query.indexed]
        if query.tag is not None:
            keys.append(prefix + "tag:" + query.tag)
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.zcard(key)
        size, key = min(zip(pipe.execute(), keys, strict=True))
        if not size:
            return []
        wanted = TaskStatus if query.statuses is None else query.statuses
        accept = {s.value for s in wanted}
        return self._newest_of(key, accept, query, shard, exact=False, scan=Scan(left=UNBOUNDED))

    def _newest_done(
        self, status: TaskStatus, query: TaskQuery, shard: int, scan: Scan
    ) -> builtins.list[Row]:
        """The ``query.end`` newest tasks of one finished status that match the query."""
        key = self.prefixes[shard] + "done:" + status.value
        exact = query.batch_id is None
        return self._newest_of(key, {status.value}, query, shard, exact=exact, scan=scan)

    def _newest_of(
        self, key: str, accept: set[str], query: TaskQuery, shard: int, *, exact: bool, scan: Scan
    ) -> builtins.list[Row]:
        """The ``query.end`` newest tasks of an index scored by creation whose status is one of
        ``accept`` and that match the query. ``exact``: every task in the index matches it but
        for the name and queue (all of a done index without a batch; a batch's group whose
        statuses are all wanted), so without a name or queue the index alone gives the rows."""
        if (
            exact
            and query.task_name is None
            and query.queue is None
            and query.tag is None
            and query.parameter is None
            and not query.by_origin
        ):
            found = self.client.zrevrange(key, 0, query.end - 1, withscores=True)
            return [(int(score), text(task_id)) for task_id, score in found]
        if (
            query.tag is None
            and query.parameter is None
            and query.batch_id is None
            and not query.by_origin
            and shard != ANY_SHARD
        ):
            return self._newest_on_server(key, accept, query, shard, scan)
        rows: builtins.list[Row] = []
        start = 0
        bounded = query.parameter is not None or scan.bounded
        while len(rows) < query.end:
            chunk = READ_CHUNK
            if bounded:
                if scan.left <= 0:
                    # The bound of a parameter search (parameter_scan.py), entries left.
                    scan.cut_short |= bool(self.client.zrevrange(key, start, start))
                    break
                chunk = min(chunk, scan.left)
            found = self.client.zrevrange(key, start, start + chunk - 1, withscores=True)
            if not found:
                break
            start += len(found)
            if bounded:
                scan.left -= len(found)
            rows += self._matching([text(i) for i, _ in found], accept, query, shard)
        return rows[: query.end]

    def _newest_on_server(
        self, key: str, accept: set[str], query: TaskQuery, shard: int, scan: Scan
    ) -> builtins.list[Row]:
        """``_newest_of`` for a query filtered only by status, name and queue (or a tag, read
        from the tag's own set): the server checks each entry's task (lua/index_match.lua),
        SERVER_CHUNK entries a call, so a count reads up to SERVER_SCAN_LIMIT of them where the
        client would stop at COUNT_SCAN_LIMIT."""
        name = "" if query.task_name is None else "=" + query.task_name
        queue = "" if query.queue is None else "=" + query.queue
        rows: builtins.list[Row] = []
        start = 0
        while len(rows) < query.end:
            chunk = SERVER_CHUNK
            if scan.bounded:
                if scan.server_left <= 0:
                    scan.cut_short |= bool(self.client.zrevrange(key, start, start))
                    break
                chunk = min(chunk, scan.server_left)
            reply = self._run("index_match", key, start, chunk, name, queue, *accept, shard=shard)
            read = int(reply[0])
            start += read
            if scan.bounded:
                scan.server_left -= read
            rows += [(int(reply[i]), text(reply[i + 1])) for i in range(1, len(reply), 2)]
            if read < chunk:
                break
        return rows[: query.end]

    def _unfinished_count(self, queue: str | None, shard: int) -> int:
        counts = self.client.hgetall(self.prefixes[shard] + "counts")
        return sum(
            int(value)
            for key, value in counts.items()
            for state, _, name in [text(key).partition(":")]
            if state in LIVE and (queue is None or name == queue)
        )

    def _unfinished_ids(
        self, live: frozenset[str], queue: str | None, newest: int | None, shard: int
    ) -> set[str]:
        """Tasks that may be unfinished (in one of the ``live`` statuses): claimed or running,
        ready, or scheduled. With ``newest``, only that many from the end of each ready list,
        fair set and schedule (a large backlog: lists are in arrival order, fair sets in round
        order, schedules in run-at order)."""
        prefix = self.prefixes[shard]
        ids = {text(i) for i in self.client.zrange(prefix + "leases", 0, -1)}
        if not live & set(WAITING):
            return ids  # RUNNING tasks are all in the leases
        first = 0 if newest is None else -newest
        if queue is not None:
            queues = [queue]
        else:
            queues = sorted(text(name) for name in self.client.smembers(prefix + "queues"))
        pipe = self.client.pipeline(transaction=False)
        for name in queues:
            pipe.zrange(prefix + "prio:" + name, 0, -1)
            pipe.zrange(prefix + "sched:" + name, first, -1)
            pipe.zrange(prefix + "fprio:" + name, 0, -1)
        replies = pipe.execute()
        # (fairness="round_robin": a fair name's due tasks wait in fair sets instead)
        fair_priorities = zip(queues, replies[2::3], strict=True)
        fair = self._fair_sets([(q, prefix, found) for q, found in fair_priorities])
        pipe = self.client.pipeline(transaction=False)
        for name, priorities, scheduled in zip(queues, replies[::3], replies[1::3], strict=True):
            ids.update(text(i) for i in scheduled)
            for priority in priorities:
                pipe.lrange(f"{prefix}ready:{name}:{text(priority)}", first, -1)
        for _, key in fair:
            pipe.zrange(key, first, -1)
        replies = pipe.execute()
        lists = len(replies) - len(fair)
        for ready in replies[:lists]:
            ids.update(text(i) for i in ready)
        for members in replies[lists:]:
            ids.update(fair_member(member)[1] for member in members)
        ids.update(self._parked_ids(first, prefix))
        return ids

    def _parked_ids(self, first: int, prefix: str) -> set[str]:
        """Waiting tasks parked by claims, of any queue of the shard of ``prefix``: those of
        capped names (max_concurrency) and those parked by key (max_concurrency_per_key)."""
        names = [text(name) for name in self.client.smembers(prefix + "parked")]
        # (index of the priorities, the parked sets' prefix before the priority)
        places = [(f"{prefix}parkprio:{name}", f"{prefix}parked:{name}:") for name in names]
        keyed = [text(name) for name in self.client.smembers(prefix + "kparked")]
        if keyed:
            pipe = self.client.pipeline(transaction=False)
            for name in keyed:
                pipe.smembers(f"{prefix}kparkkeys:{name}")
            places += [
                (f"{prefix}kparkprio:{one}", f"{prefix}kparked:{one}:")
                for name, keys in zip(keyed, pipe.execute(), strict=True)
                for one in (key_bucket(name, text(key)) for key in keys)
            ]
        if not places:
            return set()
        pipe = self.client.pipeline(transaction=False)
        for priorities, _ in places:
            pipe.zrange(priorities, 0, -1)
        pipe2 = self.client.pipeline(transaction=False)
        for (_, parked), priorities in zip(places, pipe.execute(), strict=True):
            for priority in priorities:
                pipe2.zrange(parked + text(priority), first, -1)
        return {text(i) for parked in pipe2.execute() for i in parked}

    def _matching(
        self, ids: Sequence[str], accept: Collection[str], query: TaskQuery, shard: int
    ) -> builtins.list[Row]:
        """The rows of these tasks that match the query's name, queue and origin, in the order
        given: only tasks whose status is now one of ``accept`` (status values). Tasks of ``shard``,
        or of whichever shard holds each (ANY_SHARD: a batch's, N reads a task)."""
        rows: builtins.list[Row] = []
        if query.by_origin:  # told by the id alone: no read for a task left out
            ids = [task_id for task_id in ids if query.origin_matches(task_id)]
        shards = range(len(self.prefixes)) if shard == ANY_SHARD else [shard]
        # j: the parameter, read only for a parameter search.
        names = ("c", "s", "n", "q", "bt", "bc", "tg", "j")[: 7 if query.parameter is None else 8]
        for start in range(0, len(ids), READ_CHUNK):
            chunk = ids[start : start + READ_CHUNK]
            pipe = self.client.pipeline(transaction=False)
            for task_id in chunk:
                for one in shards:
                    pipe.hmget(self._tkey(task_id, one), *names)
            read = pipe.execute()
            replies = [
                next((r for r in read[i : i + len(shards)] if r[0] is not None), read[i])
                for i in range(0, len(read), len(shards))
            ]
            for task_id, (created, state, name, queue, member_of, callback_of, tags, *j) in zip(
                chunk, replies, strict=True
            ):
                if created is None:
                    continue  # purged meanwhile
                if text(state) not in accept:
                    continue  # e.g. finished meanwhile: its done index lists it
                if query.task_name is not None and text(name) != query.task_name:
                    continue
                if query.queue is not None and text(queue) != query.queue:
                    continue
                # bt: a member's batch, bc: a callback's (TaskInfo.batch_id is either).
                if query.batch_id is not None and query.batch_id not in (
                    text(member_of) if member_of else None,
                    text(callback_of) if callback_of else None,
                ):
                    continue
                if query.tag is not None and (
                    tags is None or query.tag not in json.loads(text(tags))
                ):
                    continue
                if query.parameter is not None and not matches(
                    json.loads(text(j[0])), query.parameter
                ):
                    continue
                rows.append((int(created), task_id))
        return rows
