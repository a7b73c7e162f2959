"""executor.submit_batch: check everything, open the batch, store its members a chunk at a time,
seal it (see batches.py for the rule the storages keep)."""

from __future__ import annotations

import datetime as dt
import functools
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.db import transaction

from ..conf import ExecutorSettings
from ..core.batches import BatchInfo, NewBatch, check_callback, check_requests, member_chunks
from ..core.ids import MAX_ID_LENGTH
from ..core.records import NewTask, TaskInfo, TaskSubmitRequest
from ..exceptions import InvalidTaskOptionError, TaskSubmitError
from ..observability.announcer import Announcer
from ..observability.tracing import current_trace_context
from ..storage.base import TaskStorage
from .on_commit import after_commit, open_transaction, stores_tasks_at_commit
from .submitting import check_dependencies_exist, prepare, request_time


def submit_batch(
    storage: TaskStorage,
    settings: ExecutorSettings,
    announcer: Announcer,
    now: dt.datetime,
    requests: Sequence[TaskSubmitRequest],
    batch_id: str | None,
    on_complete: TaskSubmitRequest | None,
    on_success: TaskSubmitRequest | None,
) -> BatchInfo:
    """Validate every member and callback first (a bad one stores nothing, the error naming
    the field), then open the batch, store the members in chunks of ``BATCH_CHUNK`` (bounded
    memory whatever the batch's size) and seal it. Inside an ``atomic()`` block the database
    storage writes it all in the caller's transaction; Redis storage writes it on commit."""
    requests = check_requests(requests)
    batch = NewBatch(
        batch_id=_batch_id(batch_id),
        created_at=now,
        on_complete=_callback(on_complete, "on_complete", now, settings, storage),
        on_success=_callback(on_success, "on_success", now, settings, storage),
    )
    callback_ids = {t.task_id for t in (batch.on_complete, batch.on_success) if t is not None}
    if batch.on_complete and batch.on_success and len(callback_ids) < 2:
        raise TaskSubmitError(
            "on_complete and on_success must have different task_ids", field="on_success"
        )

    trace = current_trace_context()  # the members carry the caller's span, as submit_many's do
    new_id = storage.new_task_id

    def prepared(span: slice) -> list[NewTask]:
        at = functools.partial(request_time, now, count=len(requests))
        return [
            batch.member(prepare(request, at(index), settings, index, trace, new_id))
            for index, request in enumerate(requests[span], span.start)
        ]

    spans = member_chunks(requests)
    _check_members(storage, requests, spans, prepared, callback_ids)
    _check_new(storage, batch)

    def write() -> BatchInfo:
        if not storage.open_batch(batch):
            raise _used(batch.batch_id)
        for span in spans:
            results = storage.add_to_batch(batch.batch_id, prepared(span))
            created = [info for info, was_created in results if was_created]
            if created:
                after_commit(storage, _announcing(announcer, created))
        return storage.seal_batch(batch.batch_id)

    if not storage.supports_transactional_enqueue:
        alias = open_transaction(settings)
        if alias is not None:
            transaction.on_commit(stores_tasks_at_commit(write), using=alias)
            # As it will be once written (ids refused by then are not counted in its total).
            total = len(requests)
            return BatchInfo(batch.batch_id, total, 0, 0, 0, total, False, now, sealed=False)
    return write()


def _check_members(
    storage: TaskStorage,
    requests: Sequence[TaskSubmitRequest],
    spans: Sequence[slice],
    prepared: Callable[[slice], list[NewTask]],
    callback_ids: set[str],
) -> None:
    """The first pass: no id given twice, every member valid, new, and no callback's id
    (nothing is kept: the memory stays bounded by a chunk)."""
    repeated = _repeated_id(requests)
    if repeated is not None:
        raise TaskSubmitError(f"task_id {repeated!r} is repeated in the batch", field="task_id")
    # Members may depend on stored tasks and on members before them: the ids of earlier chunks
    # are kept for that check, only when some member has dependencies.
    earlier: set[str] | None = set() if any(r.depends_on for r in requests) else None
    keys: set[str] = set()  # the unique keys members take, when some member has dependencies
    for span in spans:
        tasks = prepared(span)
        ids = [task.task_id for task in tasks]
        debounced = next((task for task in tasks if task.debounce is not None), None)
        if debounced is not None:
            raise InvalidTaskOptionError(
                f"task {debounced.task_id!r}: a batch member is not debounced (a later submit "
                "joining it would change a member its batch counts); submit it on its own",
                field="debounce",
            )
        if earlier is not None:
            # A member whose unique key a live task (or a member before it) holds is not
            # stored: a member depending on it is refused, before the batch is opened.
            skipped = _held_members(storage, tasks, keys)
            check_dependencies_exist(storage, tasks, earlier, skipped)  # InvalidDependencyError
            earlier.update(task_id for task_id in ids if task_id not in skipped)
        clash = next((task_id for task_id in ids if task_id in callback_ids), None)
        if clash is not None:
            raise TaskSubmitError(
                f"task_id {clash!r} is both a member and a callback of the batch", field="task_id"
            )
        existing = storage.existing_ids(ids)
        if existing:
            raise TaskSubmitError(
                f"task_id {existing[0]!r} already exists: a batch member must be a new task",
                field="task_id",
            )


def _check_new(storage: TaskStorage, batch: NewBatch) -> None:
    """Neither callback's task nor the batch is stored already."""
    for field, callback in (("on_complete", batch.on_complete), ("on_success", batch.on_success)):
        if callback is not None and storage.existing_ids([callback.task_id]):
            # Stored when the batch finishes, it would find that task and store nothing.
            raise TaskSubmitError(
                f"{field}: task_id {callback.task_id!r} already exists: a batch callback must "
                "be a new task",
                field=f"{field}.task_id",
            )
    if storage.get_batch(batch.batch_id) is not None:
        raise _used(batch.batch_id)


def _held_members(storage: TaskStorage, tasks: Sequence[NewTask], keys: set[str]) -> set[str]:
    """The ids of the unique members of ``tasks`` whose key a live task holds, or a member
    before them took (``keys``, updated with the keys these take): their holder is returned
    and they are not stored."""
    held: set[str] = set()
    for task in tasks:
        key = task.unique_key
        if key is None:
            continue
        if key in keys or storage.unique_holder(key) is not None:
            held.add(task.task_id)
        else:
            keys.add(key)
    return held


def _repeated_id(requests: Sequence[TaskSubmitRequest]) -> str | None:
    """A task_id given to two members of the batch, or None. In about 4 bytes a member, not a
    set of every id (the submit's memory stays bounded by a chunk): each given id marks a bit
    of a bitmap by its hash; only the ids whose bit another had marked are compared for real
    (about 3 % of them)."""
    size = 32 * len(requests) + 64
    bits = bytearray(size // 8 + 1)
    suspects: set[int] = set()
    for request in requests:
        task_id = request.task_id
        if isinstance(task_id, str):  # (generated ids are new uuids: never repeated)
            slot = hash(task_id) % size
            byte, mask = slot >> 3, 1 << (slot & 7)
            if bits[byte] & mask:
                suspects.add(slot)
            bits[byte] |= mask
    if not suspects:
        return None
    seen: set[str] = set()
    for request in requests:
        task_id = request.task_id
        if isinstance(task_id, str) and hash(task_id) % size in suspects:
            if task_id in seen:
                return task_id
            seen.add(task_id)
    return None


def _announcing(announcer: Announcer, created: list[TaskInfo]) -> Callable[[], None]:
    """Announces these tasks as submitted, when called (now, or at the caller's commit)."""
    return lambda: announcer.submitted(created)


def _used(batch_id: str) -> TaskSubmitError:
    return TaskSubmitError(f"batch_id {batch_id!r} is already used", field="batch_id")


def _batch_id(batch_id: Any) -> str:
    """The batch's id: as given (the rules of a task_id), or a new uuid4 hex."""
    if batch_id is None:
        return uuid.uuid4().hex
    if (
        not isinstance(batch_id, str)
        or not 1 <= len(batch_id) <= MAX_ID_LENGTH
        or any(char.isspace() or unicodedata.category(char)[0] == "C" for char in batch_id)
    ):
        raise TaskSubmitError(
            f"batch_id must be a string of 1..{MAX_ID_LENGTH} characters without whitespace or "
            f"control characters, got {batch_id!r}",
            field="batch_id",
        )
    return batch_id


def _callback(
    request: Any, field: str, now: dt.datetime, settings: ExecutorSettings, storage: TaskStorage
) -> NewTask | None:
    checked = check_callback(request, field)
    if checked is None:
        return None
    try:
        return prepare(checked, now, settings, 0, None, storage.new_task_id)
    except TaskSubmitError as exc:
        raise TaskSubmitError(f"{field}: {exc}", field=f"{field}.{exc.field}") from exc
