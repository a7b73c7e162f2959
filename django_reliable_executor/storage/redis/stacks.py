"""Live stacks on the Redis storage: a hash per request and a list of request ids per worker.

``P stack:<request id>`` HASH t task id, w worker id, r requested at (µs), a the answer
(core.stacks.answer_to_json), expiring KEEP_SECONDS after the request (and again after the
answer). ``P stackreq:<worker id>`` LIST of the worker's request ids, oldest first, expiring
TAKE_WITHIN_SECONDS after the last request. ``P stacklast:<task id>`` STRING the id of the
task's last request, expiring REUSE_SECONDS after it (an unanswered one is waited for
instead of storing another). All on the control shard (``P`` is its prefix),
where the worker registry is and where a worker blocks on its list: the keys of one request
never span shards.
"""

from __future__ import annotations

import datetime as dt

from ...core.stacks import (
    KEEP_SECONDS,
    REUSE_SECONDS,
    TAKE_LIMIT,
    TAKE_WITHIN_SECONDS,
    StackAnswer,
    StackRequest,
    answer_from_json,
    answer_to_json,
)
from .access import RedisAccess, guarded
from .claiming import BLOCK_MAX_SECONDS
from .codec import from_micros, micros, text


class Stacks(RedisAccess):
    """add_stack_request, take_stack_requests, answer_stack, get_stack_request. A worker
    running tasks blocks on its request list (BLPOP, from its heartbeat thread, up to its
    next beat): a request reaches it at once, and waiting costs Redis one blocked client."""

    #: take_stack_requests blocks on the worker's list (BLPOP) until a request comes.
    blocking_stack_wait = True

    @guarded
    def add_stack_request(self, request: StackRequest) -> str:
        key = self.p + "stack:" + request.request_id
        queue = self.p + "stackreq:" + request.worker_id
        # The task's last request, if unanswered and for the same worker, is waited for
        # instead. Two viewers asking at the same instant may both store one: the bound is
        # per asker, which needs no script.
        latest = self.p + "stacklast:" + request.task_id
        waiting = self.client.get(latest)
        if waiting is not None:
            found = _request(text(waiting), self.client.hgetall(self.p + "stack:" + text(waiting)))
            since = request.requested_at - dt.timedelta(seconds=REUSE_SECONDS)
            if (
                found is not None
                and found.answer is None
                and found.worker_id == request.worker_id
                and found.requested_at >= since  # the key's TTL runs on Redis's clock
            ):
                return found.request_id
        pipe = self.client.pipeline(transaction=False)
        pipe.set(latest, request.request_id, px=max(int(REUSE_SECONDS * 1000), 1))
        pipe.hset(
            key,
            mapping={
                "t": request.task_id,
                "w": request.worker_id,
                "r": micros(request.requested_at),
            },
        )
        pipe.expire(key, int(KEEP_SECONDS))
        pipe.rpush(queue, request.request_id)
        pipe.expire(queue, int(TAKE_WITHIN_SECONDS))
        pipe.execute()
        return request.request_id

    @guarded
    def take_stack_requests(self, worker_id: str, timeout: float) -> list[StackRequest]:
        queue = self.p + "stackreq:" + worker_id
        ids: list[str] = []
        if timeout > 0:
            # Never 0 ("forever" to BLPOP), never near the client's socket timeout.
            popped = self.client.blpop([queue], timeout=min(max(timeout, 0.001), BLOCK_MAX_SECONDS))
            if popped is None:
                return []
            ids.append(text(popped[1]))
        more = self.client.lpop(queue, TAKE_LIMIT - len(ids))
        ids += [text(request_id) for request_id in more or ()]
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for request_id in ids:
            pipe.hgetall(self.p + "stack:" + request_id)
        since = self.clock.now() - dt.timedelta(seconds=TAKE_WITHIN_SECONDS)
        taken = []
        for request_id, fields in zip(ids, pipe.execute(), strict=True):
            request = _request(request_id, fields)
            if request is not None and request.answer is None and request.requested_at >= since:
                taken.append(request)
        return taken

    @guarded
    def answer_stack(self, answer: StackAnswer) -> bool:
        key = self.p + "stack:" + answer.request_id
        pipe = self.client.pipeline(transaction=False)
        pipe.exists(key)
        pipe.hsetnx(key, "a", answer_to_json(answer))
        pipe.expire(key, int(KEEP_SECONDS))  # an expired request's answer expires too
        existed, stored, _ = pipe.execute()
        return bool(existed and stored)

    @guarded
    def get_stack_request(self, request_id: str) -> StackRequest | None:
        return _request(request_id, self.client.hgetall(self.p + "stack:" + request_id))


def _request(request_id: str, fields: dict[str, str]) -> StackRequest | None:
    """A request's hash as a StackRequest; None when it expired (or holds only a late
    answer)."""
    values = {text(k): text(v) for k, v in fields.items()}
    if "t" not in values:
        return None
    answer = values.get("a")
    return StackRequest(
        request_id,
        values["t"],
        values["w"],
        from_micros(values["r"]),
        answer_from_json(answer) if answer is not None else None,
    )
