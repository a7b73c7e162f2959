"""Submitting to the Redis storage: batches of new tasks, each chunk one submit.lua call."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from ...core.dependencies import WAITING_RUN_AT, first_missing, missing_error
from ...core.records import NewTask, TaskInfo, copy_with, new_info
from ...core.serialization import dumps
from ...core.states import LIVE_STATUSES, TaskStatus
from ...exceptions import InvalidDependencyError, TaskSubmitError
from .access import RedisAccess, guarded
from .codec import fields, from_micros, micros, submit_args, text, to_info
from .debouncing import debounce_args, join_on
from .reservations import (
    ID_RESERVATION_GRACE_SECONDS,
    release_keys,
    reserve_ids,
    reserve_keys,
    take_foreign_keys,
    take_unique,
)
from .sharding import CONTROL_SHARD, unique_home

LIVE_VALUES = frozenset(status.value for status in LIVE_STATUSES)
SUBMIT_CHUNK = 500  # tasks per submit script call: long enough to amortise, short enough not
# to hold Redis up (a script blocks every other client while it runs)


class Submitting(RedisAccess):
    """enqueue: existing ids (and live holders of unique keys) returned unchanged, a debounced
    task's waiting holder joined, new ones stored and their queues woken."""

    @guarded
    def enqueue(self, tasks: Sequence[NewTask]) -> list[tuple[TaskInfo, bool]]:
        self.check_layout()  # never store a task where no worker of the prefix looks
        # Each task goes to its queue's shard (a limited name's to its home shard: see
        # _store_shard). Sharded, tasks with dependencies go in runs of one shard in the order
        # given: a dependency in the call (before its dependent) may be of another shard, and
        # is stored first.
        if not self.sharded:
            return self._enqueue_on(tasks, CONTROL_SHARD)
        homes = self.flow_limits.homes()

        def shard_of(task: NewTask) -> int:
            return self._store_shard(task.task_name, task.queue, homes)

        if not any(task.depends_on for task in tasks):
            groups: dict[int, list[NewTask]] = {}
            for task in tasks:
                groups.setdefault(shard_of(task), []).append(task)
            if len(groups) == 1:
                return self._enqueue_on(tasks, next(iter(groups)))
            return self._enqueue_groups(tasks, shard_of, groups)
        runs: list[tuple[int, list[NewTask]]] = []  # (shard, its tasks), in the order given
        for task in tasks:
            shard = shard_of(task)
            if runs and runs[-1][0] == shard:
                runs[-1][1].append(task)
            else:
                runs.append((shard, [task]))
        if len(runs) == 1:
            return self._enqueue_on(tasks, runs[0][0])
        # Several runs, each its own write: reserved first (_reserve_call), so no submit takes
        # a key or id of the call between the check and the writes (a later run's task would
        # then not be stored, and its dependents refused, after the earlier runs were stored).
        reserved = self._reserve_call(tasks, shard_of, runs, check=True)
        results: list[tuple[TaskInfo, bool]] = []
        try:
            for shard, run in runs:
                results += self._enqueue_on(run, shard, reserved)
        except BaseException:
            release_keys(self, tasks, reserved, shard_of)
            raise
        return results

    def _enqueue_groups(
        self, tasks: Sequence[NewTask], shard_of: Any, groups: dict[int, list[NewTask]]
    ) -> list[tuple[TaskInfo, bool]]:
        """Sharded, ``tasks`` without dependencies of several shards (``groups``): one write
        per shard, reserved first as below (_reserve_call), so no shard refuses after another
        stored its part (an id being submitted to another shard's queue). A task whose unique
        key an earlier task of the call has, of another shard, is submitted after every part,
        in the order given: its part may be written before the earlier one's, whose task it
        would wait for (and a debounced one joins in the order given)."""
        reserved = self._reserve_call(tasks, shard_of, sorted(groups.items()), check=False)
        later = _repeated_keys(tasks, shard_of, reserved)
        try:
            written = iter(
                self._each_shard(
                    [task for index, task in enumerate(tasks) if index not in later],
                    shard_of,
                    lambda part, shard: self._enqueue_on(part, shard, reserved),
                )
            )
        except BaseException:
            release_keys(self, tasks, reserved, shard_of)
            raise
        return [
            self._enqueue_on([task], shard_of(task))[0] if index in later else next(written)
            for index, task in enumerate(tasks)
        ]

    def _reserve_call(
        self,
        tasks: Sequence[NewTask],
        shard_of: Any,
        parts: Sequence[tuple[int, Sequence[NewTask]]],
        check: bool,
    ) -> set[str]:
        """Sharded, a call written in several ``parts`` (shard, its tasks), before the first
        is written: every unique key it stores reserved on its home (reserve_keys); with
        ``check``, its dependencies checked (_check_dependencies); then the id of every task
        it stores reserved on its directory shard, its own shard's included (id_reserve.lua;
        submit.lua drops an entry naming its own shard when it stores the task), so no submit
        of one to another shard's queue makes a later part refuse it. The ids whose key the
        call holds; on a refusal, the keys are given back and nothing is stored."""
        reserved = reserve_keys(self, tasks, shard_of)
        try:
            if check:
                self._check_dependencies(tasks, reserved)
            coming = {
                task.task_id
                for task in tasks
                if task.unique_key is None or task.unique_until is None or task.task_id in reserved
            }
            for shard, part in parts:
                reserve_ids(self, part, shard, coming)
        except BaseException:
            release_keys(self, tasks, reserved, shard_of)
            raise
        return set(reserved)

    def _check_dependencies(self, tasks: Sequence[NewTask], reserved: dict[str, int]) -> None:
        """Raise InvalidDependencyError, storing nothing, unless every dependency of ``tasks``
        is stored or a task before it in ``tasks`` that this call stores (_answered_by_holders:
        not one a live task holding its unique key answers). Decided before the first run
        writes; each run's write checks again."""
        wanted = {d for task in tasks for d in task.depends_on}
        wanted.update(task.task_id for task in tasks)
        found = self.get_many(sorted(wanted))
        error = first_missing(tasks, set(found), _answered_by_holders(tasks, found, reserved))
        if error is not None:
            raise error

    def _enqueue_on(
        self, tasks: Sequence[NewTask], shard: int, reserved: set[str] | None = None
    ) -> list[tuple[TaskInfo, bool]]:
        """Store ``tasks`` of ``shard``; those of ``reserved`` ids hold their unique key on
        its home already (reserve_keys), and are stored without it."""
        if not self.sharded:
            return self._store(tasks, shard)
        split = _after_cancellable(tasks, shard, self.layout.shards, reserved)
        if split is not None and reserved is None:
            # Split below into two writes: all or nothing needs every refusal the second can
            # raise known before the first is stored. A missing dependency is one: a request
            # answered by a live task holding its key (not stored) counts as nothing for the
            # requests after it, and which requests those are is known only once the call's
            # keys are held. So the call is reserved and checked as one of several runs is
            # (_reserve_call: its keys held, its dependencies checked with the requests the
            # holders answer, its ids reserved so none is refused as being submitted
            # elsewhere), then written. Only an error of Redis itself between the writes
            # leaves the first stored, as between the runs of enqueue.
            def here(_task: NewTask) -> int:
                return shard

            held_keys = self._reserve_call(tasks, here, [(shard, tasks)], check=True)
            try:
                return self._enqueue_on(tasks, shard, held_keys)
            except BaseException:
                release_keys(self, tasks, held_keys, here)
                raise
        if split is not None:
            # Each request is settled as if submitted alone after the ones before it: the
            # task before ``split`` holding its key may be cancelled as it is stored, and then
            # no longer holds it. Its key is taken off the script (on its home, or by the
            # call), which cannot see that cancel: the tasks from ``split`` on are submitted
            # once the ones before are stored (the call reserved and checked whole before).
            done = self._enqueue_on(tasks[:split], shard, reserved)
            return done + self._enqueue_on(tasks[split:], shard, reserved)
        # Ids whose directory is another shard are reserved there first: an id held there
        # for another shard is that shard's task, returned unchanged, never stored twice.
        held = reserve_ids(self, tasks, shard)
        keyless, same = take_foreign_keys(self, tasks, shard, held, reserved)
        rest = [t for i, t in enumerate(tasks) if i not in held and i not in same]
        try:
            stored = iter(self._store(rest, shard, keyless))
        except InvalidDependencyError:
            # Refused (a missing dependency: submit.lua stored nothing, or, after a task it
            # answered 'ureserved' or 'elsewhere', nothing more). The unique keys taken above
            # on their home shards for tasks not stored are given back, so the next submit of
            # one does not wait for a task that will never be stored. (The ids reserved above
            # stay: one may be a task this shard stores already, whose entry it needs.)
            for task in rest:
                if task.task_id in keyless and not self.client.exists(
                    self._tkey(task.task_id, shard)
                ):
                    assert task.unique_key is not None
                    home = unique_home(task.unique_key, self.layout.shards)
                    self._run("unique_release", shard, task.unique_key, task.task_id, shard=home)
            raise
        results: list[tuple[TaskInfo, bool]] = []
        for index in range(len(tasks)):
            if index in held:
                results.append(held[index])
            elif index in same:
                results.append(self._same_key(tasks[index], results[same[index]], shard))
            else:
                results.append(next(stored))
        return results

    def _same_key(
        self, task: NewTask, first: tuple[TaskInfo, bool], shard: int
    ) -> tuple[TaskInfo, bool]:
        """``task``, whose unique key the ``first`` task of the call with that key took on
        the key's home shard (so this ``shard`` stored it without the key): that task, which
        a debounced ``task`` joins (debouncing.join_on)."""
        if task.debounce is not None and first[1]:
            assert task.unique_key is not None
            home = unique_home(task.unique_key, self.layout.shards)
            joined = join_on(self, task, first[0].task_id, shard, home)
            if joined is not None:
                return joined, False
        return first[0], False

    def _unique_reserved(self, task: NewTask, shard: int) -> tuple[TaskInfo, bool]:
        """``task``, whose unique key's home is its queue's ``shard``, where submit.lua found
        the key reserved for a task of another shard: that task if it holds the key (the task
        a debounced ``task`` joined), else ``task`` stored here once the key is taken over."""
        holder = take_unique(self, task, shard, shard)
        if holder is not None:
            return holder, False
        ((info, created),) = self._store([task], shard)
        return info, created

    def _store(
        self, tasks: Sequence[NewTask], shard: int, keyless: set[str] | None = None
    ) -> list[tuple[TaskInfo, bool]]:
        """submit.lua on ``shard`` for these tasks, in chunks; those of ``keyless`` ids without
        their unique key (taken on its home shard)."""
        keyless = keyless or set()
        results: list[tuple[TaskInfo, bool]] = []
        # A batch with dependents is one call: all or nothing (a missing dependency).
        dependents = any(task.depends_on for task in tasks)
        size = len(tasks) if dependents else SUBMIT_CHUNK
        fair = self.flow_limits.fair()  # their tasks are numbered a round (core/fairness.py)
        for start in range(0, len(tasks), size):
            chunk = tasks[start : start + size]
            args = [value for task in chunk for value in _args(task, fair, None, keyless)]
            replies = self._run("submit", *args, shard=shard)
            if _missing_reply(replies) and self.sharded:
                # A dependency not on this shard (submit.lua wrote nothing): registered on its
                # own shard, then the chunk again with it as one of another shard.
                remote = self._link_remote(chunk, shard)
                args = [
                    value
                    for task in chunk
                    for value in _args(task, fair, remote.get(task.task_id), keyless)
                ]
                replies = self._run("submit", *args, shard=shard)
                # A dependency in the chunk not stored because its key was 'ureserved' (an
                # entry of a task of another shard, maybe ended since): settled on this shard,
                # its home (given back if its task ended), then the chunk again.
                settled: set[str] = set()
                while _missing_reply(replies) and text(replies[2]) not in settled:
                    dependency = text(replies[2])
                    settled.add(dependency)
                    task = next((t for t in chunk if t.task_id == dependency), None)
                    if task is None or task.task_id in keyless or task.unique_key is None:
                        break
                    if task.debounce is not None:
                        break  # refused rather than joining a task for a call refused
                    if unique_home(task.unique_key, self.layout.shards) != shard:
                        break
                    if take_unique(self, task, shard, shard) is not None:
                        break  # held by a live task: refused
                    replies = self._run("submit", *args, shard=shard)
            if self.sharded and any(t.depends_on and t.batch_id for t in chunk):
                # A member cancelled at once (a dependency failed) told its batch's shard.
                self._deliver_now(shard)
            if _missing_reply(replies):
                raise self._missing(text(replies[1]), text(replies[2]), shard)
            results += [
                self._answer(task, reply, shard, keyless)
                for task, reply in zip(chunk, replies, strict=True)
            ]
        return results

    def _answer(
        self, task: NewTask, reply: Any, shard: int, keyless: set[str]
    ) -> tuple[TaskInfo, bool]:
        """What submit.lua's reply for ``task`` says: the task and whether it was stored."""
        if reply == 1:
            return new_info(task), True
        if isinstance(reply, (str, bytes)) and text(reply) == "ureserved":
            return self._unique_reserved(task, shard)
        if isinstance(reply, (str, bytes)):  # "elsewhere": another shard's task
            return self._stored_elsewhere(task, shard, keyless)
        if len(reply) == 2 and isinstance(reply[0], list):  # a new dependent
            return to_info(task.task_id, fields(reply[0])), True
        if len(reply) == 3 and isinstance(reply[1], list):  # joined (debounce)
            return copy_with(to_info(text(reply[0]), fields(reply[1])), debounced=True), False
        if len(reply) == 2 and isinstance(reply[1], list):  # a unique key's holder
            return to_info(text(reply[0]), fields(reply[1])), False
        return to_info(task.task_id, fields(reply)), False

    def _missing(self, task_id: str, dependency: str, shard: int) -> TaskSubmitError:
        """The error of a dependency submit.lua did not find on the dependent's shard."""
        return missing_error(task_id, [dependency])

    def _link_remote(self, chunk: Sequence[NewTask], shard: int) -> dict[str, dict[str, str]]:
        """Sharded: the dependencies of ``chunk``'s tasks that are stored on another shard, per
        task: id -> its status when dep_link.lua registered the task as its dependent there
        ('' = live: its ending will send the outcome). Registered before the task is stored,
        so that no ending falls between (one that comes first arrives in P xdone:<id>).
        Raises InvalidDependencyError, storing nothing here, for a dependency stored nowhere
        and not in ``chunk`` before its dependent. One in ``chunk`` that is stored elsewhere
        (an idempotent resubmit of a task of another shard) is that task: linked there. One
        stored nowhere is left to submit.lua, which refuses it unless it stores it first."""
        earlier: set[str] = set()
        coming: dict[str, set[str]] = {}  # dependent -> its dependencies in chunk before it
        wanted: dict[str, list[str]] = {}
        for task in chunk:
            if task.depends_on:
                wanted[task.task_id] = list(task.depends_on)
                coming[task.task_id] = earlier & set(task.depends_on)
            earlier.add(task.task_id)
        ids = sorted({d for deps in wanted.values() for d in deps})
        if not ids:
            return {}
        # Each dependency on every shard, in one round trip (this shard's answer first).
        order = [shard, *(s for s in range(len(self.prefixes)) if s != shard)]
        pipe = self.client.pipeline(transaction=False)
        for dependency in ids:
            for one in order:
                pipe.exists(self._tkey(dependency, one))
        found = pipe.execute()
        homes: dict[str, int] = {}
        for index, dependency in enumerate(ids):
            where = found[index * len(order) : (index + 1) * len(order)]
            home = next((one for one, there in zip(order, where, strict=True) if there), None)
            if home is not None:
                homes[dependency] = home
        for task_id, deps in wanted.items():  # every task checked before the first link
            missing = [d for d in deps if d not in homes and d not in coming[task_id]]
            if missing:
                raise missing_error(task_id, missing)
        remote: dict[str, dict[str, str]] = {}
        for task_id, deps in wanted.items():
            deps = [d for d in deps if d in homes]
            by_shard: dict[int, list[str]] = {}
            for dependency in deps:
                if homes[dependency] != shard:
                    by_shard.setdefault(homes[dependency], []).append(dependency)
            for home, listed in sorted(by_shard.items()):
                replies = self._run("dep_link", shard, task_id, *listed, shard=home)
                for dependency, status in zip(listed, replies, strict=True):
                    if not text(status):
                        raise missing_error(task_id, [dependency])  # purged meanwhile
                    remote.setdefault(task_id, {})[dependency] = (
                        "" if text(status) in LIVE_VALUES else text(status)
                    )
        return remote

    def _stored_elsewhere(
        self, task: NewTask, shard: int, keyless: set[str]
    ) -> tuple[TaskInfo, bool]:
        """``task``, whose queue's shard is its id's directory, which says another shard holds
        the id: that shard's task (not created), or, when that shard never stored it and its
        reservation is older than the grace (its submitter crashed), ``task`` stored here
        after all (created)."""
        existing = self.get(task.task_id)
        if existing is not None:
            return existing, False
        entry = self.client.get(self.prefixes[shard] + "i:" + task.task_id)
        if entry is not None:
            other, at = text(entry).split(" ", 1)
            age = (self.clock.now() - from_micros(at)).total_seconds()
            if age < ID_RESERVATION_GRACE_SECONDS:  # on its way there: never store it twice
                raise TaskSubmitError(
                    f"task_id {task.task_id!r} is being submitted to a queue of shard {other} "
                    f"(reserved {age:.0f} s ago); submit it to that shard's queue, or again "
                    f"after {ID_RESERVATION_GRACE_SECONDS} s",
                    field="task_id",
                )
            # Take the stale reservation over for this shard (only if unchanged since read),
            # then drop it: a task stored on its id's directory shard needs no entry.
            reply = self._run("id_reserve", shard, task.task_id, text(entry), shard=shard)
            if text(reply[0]):
                raise TaskSubmitError(
                    f"task_id {task.task_id!r} is being submitted to another shard's queue",
                    field="task_id",
                )
            self._run("id_release", shard, task.task_id, shard=shard)
        ((info, created),) = self._store([task], shard, keyless)
        return info, created


def _repeated_keys(tasks: Sequence[NewTask], shard_of: Any, reserved: set[str]) -> set[int]:
    """The positions of ``tasks`` whose unique key a task before them has, of a key whose
    tasks are of several shards (``shard_of``); not one whose key the call holds for it
    (``reserved``: the first not stored of its key)."""
    shards: dict[str, set[int]] = {}
    for task in tasks:
        if task.unique_key is not None and task.unique_until is not None:
            shards.setdefault(task.unique_key, set()).add(shard_of(task))
    seen: set[str] = set()
    later: set[int] = set()
    for index, task in enumerate(tasks):
        key = task.unique_key
        if key is None or len(shards.get(key, ())) < 2:
            continue
        if key in seen and task.task_id not in reserved:
            later.add(index)
        seen.add(key)
    return later


def _answered_by_holders(
    tasks: Sequence[NewTask], found: dict[str, TaskInfo], reserved: Collection[str]
) -> set[str]:
    """The ids of ``tasks`` (one call, its unique keys held: ``reserved``, reserve_keys) not
    stored because a live task holding their unique key answers them, each request settled
    as submit.lua settles it after the ones before (``found``: the tasks stored, by id): a
    task stored already answers for itself; the first request of a key the call does not
    hold is answered by its live holder; a later one by the task of the call holding it,
    unless that task is cancelled as it is stored (a dependency ended other than completed,
    and it does not say "run": cancelled_at_once), which frees the key for the next."""
    call_keys = {t.unique_key for t in tasks if t.task_id in reserved}
    holding: set[str] = set()  # keys a task of the call holds, not cancelled
    cancelled: set[str] = set()  # tasks of the call cancelled as they are stored
    skipped: set[str] = set()
    seen: set[str] = set()  # a repeated id is answered by its first request
    for task in tasks:
        if task.task_id in found or task.task_id in seen:
            continue
        seen.add(task.task_id)
        key = task.unique_key if task.unique_until is not None else None
        if key is not None and (key in holding or key not in call_keys):
            skipped.add(task.task_id)
            continue
        if task.on_dependency_failure != "run" and any(
            d in cancelled or (d in found and _ended_badly(found[d])) for d in task.depends_on
        ):
            cancelled.add(task.task_id)
        elif key is not None:
            holding.add(key)
    return skipped


def _ended_badly(info: TaskInfo) -> bool:
    """Whether a dependency ``info`` cancels a new dependent as it is stored (submit.lua's
    cancelled_at_once): ended other than completed, its handler not running on."""
    return (
        info.status not in LIVE_STATUSES
        and not info.handler_running
        and info.status is not TaskStatus.COMPLETED
    )


def _after_cancellable(
    tasks: Sequence[NewTask], shard: int, shards: int, reserved: set[str] | None
) -> int | None:
    """The first position of ``tasks`` (to be stored on ``shard``) whose unique key a task
    before it has that may be cancelled as it is stored (a dependency already ended badly)
    and takes the key off submit.lua (its home is another shard, or the call holds it:
    ``reserved``), else None. submit.lua knows that such a task, cancelled, frees its key
    for a later request of the call (cancelled_at_once); take_foreign_keys cannot."""
    cancellable: set[str] = set()
    for index, task in enumerate(tasks):
        key = task.unique_key
        if key is None or task.unique_until is None:
            continue
        if key in cancellable:
            return index
        off_script = unique_home(key, shards) != shard or (
            reserved is not None and task.task_id in reserved
        )
        if off_script and task.depends_on and task.on_dependency_failure != "run":
            cancellable.add(key)
    return None


def _missing_reply(replies: list[Any]) -> bool:
    """Whether submit.lua answered that a dependency is missing (and stored nothing)."""
    return (
        bool(replies) and not isinstance(replies[0], (int, list)) and text(replies[0]) == "missing"
    )


def _args(
    task: NewTask,
    fair: Collection[str],
    remote: dict[str, str] | None = None,
    keyless: set[str] | None = None,
) -> list[str]:
    """Every value submit.lua takes for ``task``: submit_args (``fair``: the names with
    fairness), the unique key's 2, then its dependencies (JSON; one of another shard, in
    ``remote``, as [id, its status]) and on-failure policy (a dependent is stored waiting: no
    run at, no deadline yet), then its debounce's 2 (debounce_args). A task of ``keyless``
    goes without its unique key (taken on the key's home shard)."""
    unique = ("", "") if keyless and task.task_id in keyless else _unique(task)
    if not task.depends_on:
        return [*submit_args(task, fair), *unique, "", "", *debounce_args(task)]
    waiting = copy_with(task, run_at=WAITING_RUN_AT, deadline_at=None)
    policy = "run" if task.on_dependency_failure == "run" else ""
    deps: list[object] = list(task.depends_on)
    if remote:
        deps = [[d, remote[d]] if d in remote else d for d in task.depends_on]
    return [*submit_args(waiting, fair), *unique, dumps(deps), policy, *debounce_args(task)]


def _unique(task: NewTask) -> tuple[str, str]:
    """The 2 values submit.lua takes per task after submit_args: key digest, window end."""
    if task.unique_key is None or task.unique_until is None:
        return ("", "")
    return (task.unique_key, micros(task.unique_until))
