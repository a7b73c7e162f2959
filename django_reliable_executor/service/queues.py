"""Which queue names pause_queue and resume_queue accept: the queue rule, and a known queue."""

from __future__ import annotations

from ..core.options import RULES
from ..exceptions import InvalidQueueError, UnknownQueueError
from ..registry import all_handlers, declared_schedules
from ..storage import TaskStorage

DEFAULT_QUEUE = "default"
SCHEDULE_PAGE = 1000


def check_queue_name(name: object) -> str:
    """``name`` if it passes the rule every task's queue passes; else InvalidQueueError."""
    test, expected = RULES["queue"]
    if not test(name):
        raise InvalidQueueError(f"queue must be {expected}, got {name!r}")
    assert isinstance(name, str)
    return name


def check_known_queue(storage: TaskStorage, name: object) -> str:
    """``name`` if it is a valid queue name in use: paused already, the default queue, the
    queue of a registered handler or of a schedule, served by a live worker, or holding
    tasks. UnknownQueueError naming the queue otherwise: a mistyped name would
    otherwise pause a queue nothing uses, and the operator would think the real one paused.
    The cheap sources are asked first; counting the stored queues comes last."""
    queue = check_queue_name(name)
    if queue == DEFAULT_QUEUE or queue in declared_queues():
        return queue
    if queue in storage.paused_queues():
        return queue
    if any(queue in worker.queues for worker in storage.workers()):
        return queue
    if queue in storage.count_by_queue():
        return queue
    if _stored_schedules_use(storage, queue):
        return queue
    raise UnknownQueueError(
        f"unknown queue {queue!r}: no registered handler, stored task, live worker or schedule "
        "uses it"
    )


def _stored_schedules_use(storage: TaskStorage, queue: str) -> bool:
    """Does a stored schedule fire into ``queue``? Read a page at a time, only for a name
    nothing cheaper knows (a typo, usually)."""
    offset = 0
    while True:
        page = storage.list_schedules(limit=SCHEDULE_PAGE, offset=offset)
        if any(info.queue == queue for info in page):
            return True
        if len(page) < SCHEDULE_PAGE:
            return False
        offset += len(page)


def declared_queues() -> set[str]:
    """The queues of the registered handlers and of the schedules they declare."""
    queues = {handler.queue for handler in all_handlers().values()}
    queues.update(spec.queue for spec in declared_schedules() if spec.queue)
    return queues
