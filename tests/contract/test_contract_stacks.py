"""Live stack requests through the service and the storage, on every storage (a sharded Redis
too): refused for a task with no running handler (nothing stored), taken by the task's worker
only, answered once, read back whole, bounded and storable whatever the frames hold, and no
longer taken once old; an unanswered request turns into StackNotAnsweredError after
ANSWER_SECONDS. The real workers' side is tests/integration/admin/test_admin_stacks.py."""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from django_reliable_executor.core.stacks import (
    ANSWER_SECONDS,
    REUSE_SECONDS,
    STACK_MAX_CHARS,
    TAKE_WITHIN_SECONDS,
    StackAnswer,
    StackRequest,
    bounded,
)
from django_reliable_executor.exceptions import StackNotAnsweredError, TaskNotRunningError
from tests.conftest import sharded_redis_storage
from tests.support.contract_support import claim_and_start


def answer_for(request, clock, **fields) -> StackAnswer:
    values = dict(
        request_id=request.request_id,
        task_id=request.task_id,
        worker_id=request.worker_id,
        answered_at=clock.now(),
        running=True,
        stack='  File "demo/tasks.py", line 152, in record\n    time.sleep(seconds)\n',
        elapsed_seconds=1.5,
        attempt_timeout=30.0,
        pid=123,
        rss_bytes=45 * 2**20,
        where="child process 123",
    )
    return StackAnswer(**{**values, **fields})


def test_a_request_reaches_only_its_worker_and_its_answer_is_read_back(executor, clock):
    executor.submit("demo.echo", 1, task_id="t1")
    claim_and_start(executor.storage, worker="w1")
    storage = executor.storage
    request_id = executor.request_stack("t1")
    assert executor.task_stack("t1", request_id) is None  # not answered yet
    assert storage.take_stack_requests("w2", 0) == []  # another worker's
    (taken,) = storage.take_stack_requests("w1", 0)
    assert (taken.request_id, taken.task_id, taken.worker_id) == (request_id, "t1", "w1")
    assert taken.requested_at == clock.now() and taken.answer is None

    answer = answer_for(taken, clock)
    assert storage.answer_stack(answer)
    assert not storage.answer_stack(dataclasses.replace(answer, stack="second"))  # once
    assert executor.task_stack("t1", request_id) == answer
    assert storage.take_stack_requests("w1", 0) == []  # answered: not taken again
    with pytest.raises(StackNotAnsweredError, match="no stack request"):
        executor.task_stack("other-task", request_id)  # a request is read for its own task


def test_a_task_without_a_running_handler_is_refused_and_nothing_is_stored(executor, storage):
    executor.submit("demo.echo", 1, task_id="waiting")
    with pytest.raises(TaskNotRunningError, match="'waiting' is CREATED, and no handler"):
        executor.request_stack("waiting")
    with pytest.raises(TaskNotRunningError, match="no task has the id 'ghost'"):
        executor.request_stack("ghost")
    with pytest.raises(TaskNotRunningError, match="no task has the id"):
        executor.request_stack("bad\x00id")  # no storage could hold it: not looked up
    assert storage.take_stack_requests("w1", 0) == []
    with pytest.raises(StackNotAnsweredError, match="no stack request 'nope'"):
        executor.task_stack("waiting", "nope")


def test_an_unanswered_request_reports_the_worker_after_the_answer_time(executor, clock):
    executor.submit("demo.echo", 1, task_id="t1")
    claim_and_start(executor.storage, worker="w1")
    executor.storage.worker_seen("w1", {"hostname": "h", "pid": 1, "queues": ["default"]})
    request_id = executor.request_stack("t1")
    clock.advance(ANSWER_SECONDS - 0.1)
    assert executor.task_stack("t1", request_id) is None
    clock.advance(0.2)
    with pytest.raises(StackNotAnsweredError) as raised:
        executor.task_stack("t1", request_id)
    assert str(raised.value) == (
        "worker w1 did not answer within 5 s (its last heartbeat was 5.1 s ago): it is gone, "
        "frozen (a stopped process, or a handler holding the GIL), or cannot reach the storage"
    )
    # Too old to be answered now: a worker back from a long pause does not take it.
    clock.advance(TAKE_WITHIN_SECONDS)
    assert executor.storage.take_stack_requests("w1", 0) == []


def test_a_stack_is_bounded_and_storable_whatever_the_frames_hold(executor, clock):
    executor.submit("demo.echo", 1, task_id="t1")
    claim_and_start(executor.storage, worker="w1")
    request_id = executor.request_stack("t1")
    (taken,) = executor.storage.take_stack_requests("w1", 0)
    frame = '  File "odd\ud800.py", line 1, in f\n    x = "\x00 \U0001f600 é"\n'
    stack, truncated = bounded(frame * 3000)
    assert truncated and len(stack) <= STACK_MAX_CHARS
    assert stack.startswith("... (") and "\ud800" not in stack and "\x00" not in stack
    assert executor.storage.answer_stack(answer_for(taken, clock, stack=stack, truncated=True))
    stored = executor.task_stack("t1", request_id)
    assert stored.stack == stack and stored.truncated and "\U0001f600 é" in stored.stack


def test_requests_live_on_the_control_shard_of_a_sharded_redis(clock):
    with sharded_redis_storage("stacks", 3, clock) as storage:
        request = StackRequest("a" * 32, "t1", "w1", clock.now())
        storage.add_stack_request(request)
        client, request_key = storage.client, "stack:" + "a" * 32
        assert client.exists(storage.p + request_key, storage.p + "stackreq:w1") == 2
        for prefix in storage.prefixes[1:]:  # nothing on the other shards
            assert client.exists(prefix + request_key, prefix + "stackreq:w1") == 0
        assert client.ttl(storage.p + request_key) > 0
        assert storage.take_stack_requests("w1", 0.01) == [request]
        assert storage.take_stack_requests("w1", 0.01) == []  # taken once, then blocks
        assert storage.answer_stack(answer_for(request, clock))
        assert storage.get_stack_request("a" * 32).answer.rss_bytes == 45 * 2**20


def test_a_stack_the_child_cannot_format_never_stops_its_reader(monkeypatch):
    # The child's reader thread is how its tasks reach it too: a stack request that fails to
    # format must be answered all the same, and the next task still come through.
    from multiprocessing import Pipe

    from django_reliable_executor.worker import process_child

    def broken(frame):
        raise RuntimeError("no frames today")

    monkeypatch.setattr(process_child, "format_stack", broken)
    parent, child = Pipe()
    sent: list[dict] = []
    inbox = process_child._reader(child, sent.append, threading.get_ident())
    parent.send_bytes(json.dumps({"stack": "a" * 32, "task_id": "t1"}).encode())
    parent.send_bytes(json.dumps({"task": {"task_id": "t2"}}).encode())
    assert inbox.get(timeout=2) == {"task": {"task_id": "t2"}}
    (reply,) = sent
    assert reply["status"] == "stack" and reply["request_id"] == "a" * 32
    assert "RuntimeError: no frames today" in reply["stack"]
    parent.close()
    assert inbox.get(timeout=2) is None


def test_asking_again_waits_for_the_unanswered_request(executor, clock):
    # A viewer clicking "Show stack" again and again (or a script asking in a loop) stores no
    # more requests: while one for the task is unanswered and recent, its id comes back.
    executor.submit("demo.echo", 1, task_id="t1")
    claim_and_start(executor.storage, worker="w1")
    first = executor.request_stack("t1")
    assert {executor.request_stack("t1") for _ in range(30)} == {first}
    (taken,) = executor.storage.take_stack_requests("w1", 0)  # one stored, not 31
    assert taken.request_id == first
    clock.advance(REUSE_SECONDS - 0.1)
    assert executor.request_stack("t1") == first  # taken, not answered yet: still waited for
    assert executor.storage.answer_stack(answer_for(taken, clock))
    second = executor.request_stack("t1")  # answered: asking again asks anew
    assert second != first
    clock.advance(REUSE_SECONDS + 0.1)  # unanswered too long: the next asking asks anew
    third = executor.request_stack("t1")
    assert third not in (first, second)
    assert executor.request_stack("t1") == third
    assert [r.request_id for r in executor.storage.take_stack_requests("w1", 0)] == [
        second,
        third,
    ]


def test_a_request_whose_task_ended_before_its_worker_answered_says_so(executor, clock):
    # The worker runs nothing more once the handler ended, so it looks for no requests: the
    # request made as the handler ended gets its answer from task_stack, at once.
    executor.submit("demo.echo", 1, task_id="t1")
    claim = claim_and_start(executor.storage, worker="w1")
    request_id = executor.request_stack("t1")
    assert executor.task_stack("t1", request_id) is None  # still running: waited for
    assert executor.storage.complete(claim, 1) is not None
    answer = executor.task_stack("t1", request_id)
    assert (answer.running, answer.stack, answer.worker_id) == (False, "", "w1")
    assert answer.where == (
        "the task ended (COMPLETED) before its worker answered: no handler of it runs now"
    )
    assert executor.task_stack("t1", request_id) == answer  # stored as the request's answer
    (request,) = [executor.storage.get_stack_request(request_id)]
    assert not executor.storage.answer_stack(answer_for(request, clock))  # answered once
    # Answered: the databases' poll takes it no more (Redis's list hands it out once).
    assert executor.storage.take_stack_requests("w1", 0) == []
