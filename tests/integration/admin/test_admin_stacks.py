"""A running task's live stack, asked of its real worker (runexecutor subprocesses) through the
storage: the JSON endpoint behind the task page's "Show stack" answers within 2 s with the
handler's ``time.sleep`` frame, on every storage, from a thread and from a --pool process child
(with the child's memory); a task that is not running is refused; a frozen worker (SIGSTOP) is
reported as not answering."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid

import pytest

from django_reliable_executor.core.stacks import StackAnswer, StackRequest
from django_reliable_executor.core.states import TaskStatus
from django_reliable_executor.exceptions import StackNotAnsweredError, TaskNotRunningError
from django_reliable_executor.models import ReliableStackRequest
from django_reliable_executor.worker.stacks import LOOP_WAIT_SECONDS
from tests.support.admin_support import admin_params, detail_url, executor_on, make_user
from tests.support.processes import LEASE, Backend, executions, wait_until
from tests.support.stacks_support import SLEEP, running_record, stack_url


def show_stack(client, task_id: str, within: float = 2.0) -> dict:
    """What the page's script does: POST, then poll until the state is not "waiting"; fails
    unless that took less than ``within`` seconds."""
    began = time.monotonic()
    posted = client.post(stack_url(task_id))
    assert posted.status_code == 202, posted.content
    request_id = posted.json()["request_id"]
    while True:
        data = client.get(stack_url(task_id), {"request": request_id}).json()
        if data["state"] != "waiting":
            break
        assert time.monotonic() - began < within, "no answer within the time allowed"
        time.sleep(0.05)
    assert time.monotonic() - began < within
    return data


def login(client, *permissions: str):
    client.force_login(make_user("ops", *permissions))
    return client


@pytest.mark.parametrize("backend", admin_params())
def test_show_stack_of_a_handler_asleep_in_a_thread(backend, workers, client):
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        worker = workers.start(where, lease_timeout=LEASE)
        task_id = running_record(service, where, workers, attempt_timeout=30)
        # A viewer may ask: a stack shows code paths, no data (stack_pages.py).
        viewer = make_user("viewer", "view_reliabletask")
        client.force_login(viewer)
        data = show_stack(client, task_id)
        assert data["state"] == "answered" and data["running"], data
        stack = data["stack"]
        assert "time.sleep(seconds)" in stack and ", in record\n" in stack, stack
        assert stack.rstrip().endswith("time.sleep(seconds)")  # innermost frame last
        facts = dict(data["facts"])
        assert facts["Worker"] == worker.worker_id
        assert facts["Where"].startswith("thread ")
        assert facts["Where"].endswith(f" of process {worker.pid}")
        assert facts["Attempt timeout"].startswith("30.0 s, ") and facts[
            "Attempt timeout"
        ].endswith(" left")
        assert facts["Deadline"] == "none (no max_duration_millis)"
        assert 0 < data["elapsed_seconds"] < SLEEP + 1
        assert data["rss_bytes"] is None  # a thread: the worker's memory is not the handler's

        # The page offers the button while the task runs.
        html = client.get(detail_url(task_id)).content.decode()
        assert 'id="re-show-stack"' in html and stack_url(task_id) in html

        # An async handler on the worker's event loop: its coroutine's own frames, down to
        # the handler's await (not the loop thread's select()).
        coroutine = service.submit("demo.async_journal", {"record": True, "sleep": SLEEP})
        wait_until(lambda: executions(where, coroutine.task_id).exists(), 10, "no async start")
        answer = wait_for_answer(
            service, coroutine.task_id, service.request_stack(coroutine.task_id)
        )
        assert answer.running and answer.where.startswith("coroutine on the event loop (thread ")
        assert answer.where.endswith(f" of process {worker.pid})")
        lines = answer.stack.splitlines()
        handler = next(i for i, line in enumerate(lines) if line.endswith(", in async_journal"))
        assert lines[handler + 1].strip() == 'await asyncio.sleep(float(param["sleep"]))'
        assert '/demo/tasks.py", line ' in lines[handler]
        assert "_run_once" not in answer.stack and "run_forever" not in answer.stack
        assert ", in sleep\n" in answer.stack  # asyncio.sleep's own frame, innermost

        # Not running: refused with a clear error, nothing stored.
        waiting = service.submit("demo.record", {}, delay_millis=60_000).task_id
        refused = client.post(stack_url(waiting))
        assert refused.status_code == 409
        assert refused.json() == {
            "state": "refused",
            "error": f"task {waiting!r} is CREATED, and no handler of it is running: "
            "only a running handler has a live stack",
        }
        with pytest.raises(TaskNotRunningError, match="no task has the id 'nope'"):
            service.request_stack("nope")
        assert 'id="re-show-stack"' not in client.get(detail_url(waiting)).content.decode()
        # Staff without the view permission: 403 (before anything is stored).
        client.force_login(make_user("nobody"))
        assert client.post(stack_url(task_id)).status_code == 403
        client.force_login(viewer)
        # An unknown request: a clear error, not a wait forever.
        data = client.get(stack_url(task_id), {"request": "0" * 32}).json()
        assert data == {
            "state": "no_answer",
            "error": f"no stack request '{'0' * 32}' for task {task_id!r}: requests are kept 600 s",
        }


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_show_stack_of_a_handler_asleep_in_a_child_process(backend, workers, client):
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        worker = workers.start(where, "--pool", "process", "--max-pool-size", "1")
        task_id = running_record(service, where, workers, max_duration_millis=60_000)
        data = show_stack(login(client, "view_reliabletask", "operate_reliabletask"), task_id)
        assert data["state"] == "answered" and data["running"], data
        stack = data["stack"]
        assert "time.sleep(seconds)" in stack and ", in record\n" in stack, stack
        assert "process_child.py" in stack  # the child's own main thread
        facts = dict(data["facts"])
        child = int(facts["Where"].removeprefix("child process "))
        assert child != worker.pid and child == executions(where, task_id).get().pid
        # The child's resident memory: a Django process is tens of MiB.
        assert 10 * 2**20 < data["rss_bytes"] < 2**31
        assert facts["Memory (RSS)"].endswith(" MiB")
        assert ", in 5" in facts["Deadline"] and facts["Attempt timeout"] == "none"


@pytest.mark.parametrize("backend", admin_params(["default"]))
def test_a_frozen_worker_is_reported_as_not_answering(backend, workers, client, monkeypatch):
    monkeypatch.setattr("django_reliable_executor.service.stacks.ANSWER_SECONDS", 1.0)
    # A request is reused for as long as it may still be answered (core.stacks.REUSE_SECONDS).
    monkeypatch.setattr("django_reliable_executor.storage.database.stacks.REUSE_SECONDS", 1.0)
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        # A lease that outlasts the freeze: the task stays RUNNING, held by the worker.
        worker = workers.start(where, lease_timeout=10)
        task_id = running_record(service, where, workers)
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            login(client, "view_reliabletask")
            request_id = client.post(stack_url(task_id)).json()["request_id"]
            data = client.get(stack_url(task_id), {"request": request_id}).json()
            assert data == {"state": "waiting"}
            # Asking again while it is unanswered: the same request, none more stored.
            again = {client.post(stack_url(task_id)).json()["request_id"] for _ in range(10)}
            assert again == {request_id}
            assert ReliableStackRequest.objects.using(backend).filter(task_id=task_id).count() == 1
            time.sleep(1.1)
            data = client.get(stack_url(task_id), {"request": request_id}).json()
            assert data["state"] == "no_answer"
            assert data["error"].startswith(
                f"worker {worker.worker_id} did not answer within 1 s (its last heartbeat was "
            )
            assert "it is gone, frozen" in data["error"]
            with pytest.raises(StackNotAnsweredError):
                service.task_stack(task_id, request_id)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        # Thawed, it answers a new request (within the usual 5 s: a worker just thawed on a
        # loaded machine took more than the 1 s set above to catch up).
        monkeypatch.setattr("django_reliable_executor.service.stacks.ANSWER_SECONDS", 5.0)
        answer = wait_for_answer(service, task_id, service.request_stack(task_id), 10)
        assert answer.running and "time.sleep(seconds)" in answer.stack


def wait_for_answer(service, task_id: str, request_id: str, seconds: float = 3) -> StackAnswer:
    return wait_until(lambda: service.task_stack(task_id, request_id), seconds, "no answer")


@pytest.mark.parametrize("backend", admin_params(["redis"]))
def test_stack_requests_to_a_stopped_child_never_hold_up_the_heartbeat(
    backend, workers, monkeypatch
):
    # The child cannot read its pipe (stopped here; a C call holding its GIL does the same):
    # thousands of requests must not fill that pipe and block the heartbeat thread on it.
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        worker = workers.start(
            where, "--pool", "process", "--max-pool-size", "1", lease_timeout=LEASE
        )
        task_id = running_record(service, where, workers)
        child = executions(where, task_id).get().pid
        os.kill(child, signal.SIGSTOP)
        try:
            # As request_stack stores them (it reads the task first: slower), 600 at once;
            # 417 were enough to fill the pipe before a child got at most MAX_STACKS_ASKED.
            # Each one stored, none reused (as many askers at once could, each storing one).
            monkeypatch.setattr("django_reliable_executor.storage.redis.stacks.REUSE_SECONDS", -1.0)
            now = service.clock.now()
            for _ in range(600):
                request = StackRequest(uuid.uuid4().hex, task_id, worker.worker_id, now)
                service.storage.add_stack_request(request)
            time.sleep(2 * LEASE)
            seen = service.storage.worker_last_seen(worker.worker_id)
            age = (service.clock.now() - seen).total_seconds()
            assert age < LEASE, f"the heartbeat stalled: last seen {age:.1f} s ago"
            assert service.get_task(task_id).status is TaskStatus.RUNNING
        finally:
            with contextlib.suppress(ProcessLookupError):  # terminated once its lease was lost
                os.kill(child, signal.SIGCONT)
        # Running again, the child answers what it was sent and its task completes.
        wait_until(
            lambda: service.get_task(task_id).status is TaskStatus.COMPLETED, 10, "not completed"
        )


@pytest.mark.parametrize("backend", admin_params(["default", "redis"]))
def test_a_request_made_as_the_handler_ends_gets_a_clear_answer(backend, workers, client):
    # request_stack read the task RUNNING, then the handler ended before the request was
    # stored: the worker, running nothing now, looks for no requests. The page must say the
    # task ended, at once, not wait ANSWER_SECONDS and then blame the worker.
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        worker = workers.start(where, lease_timeout=LEASE)
        info = service.submit("demo.record", {"sleep": 0.3})
        wait_until(lambda: executions(where, info.task_id).exists(), 15, "no start")
        running = service.get_task(info.task_id)
        assert running.status is TaskStatus.RUNNING and running.worker_id == worker.worker_id
        wait_until(
            lambda: service.get_task(info.task_id).status is TaskStatus.COMPLETED, 10, "not done"
        )
        request = StackRequest(
            uuid.uuid4().hex, info.task_id, worker.worker_id, service.clock.now()
        )
        request_id = service.storage.add_stack_request(request)  # as request_stack stores it
        login(client, "view_reliabletask")
        began = time.monotonic()
        data = client.get(stack_url(info.task_id), {"request": request_id}).json()
        assert time.monotonic() - began < 1
        assert data["state"] == "answered" and not data["running"] and data["stack"] == ""
        assert dict(data["facts"])["Where"] == (
            "the task ended (COMPLETED) before its worker answered: no handler of it runs now"
        )
        # Stored as its answer: the worker answers it no more, and it reads back the same.
        assert service.storage.get_stack_request(request_id).answer.running is False
        assert client.get(stack_url(info.task_id), {"request": request_id}).json() == data


@pytest.mark.parametrize("backend", admin_params(["redis"]))
def test_an_async_handler_blocking_the_event_loop_shows_the_blocking_call(backend, workers):
    # The loop cannot read its coroutines while a handler blocks it (time.sleep, no await):
    # after LOOP_WAIT_SECONDS the worker answers with the loop thread's frames, which show
    # the blocking call.
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        workers.start(where, lease_timeout=LEASE)
        info = service.submit("demo.async_journal", {"record": True, "block": 2.0})
        wait_until(lambda: executions(where, info.task_id).exists(), 10, "no async start")
        time.sleep(0.2)  # into its time.sleep
        answer = wait_for_answer(service, info.task_id, service.request_stack(info.task_id))
        assert answer.running and answer.where.startswith("the event loop's thread ")
        assert f"within {LOOP_WAIT_SECONDS:g} s" in answer.where
        last = answer.stack.rstrip().splitlines()[-1]  # the innermost frame's line
        assert last.strip().startswith('time.sleep(float(param["block"]))')


@pytest.mark.parametrize("backend", admin_params(["redis"]))
def test_an_async_handler_in_a_child_process_shows_its_coroutine(backend, workers):
    # Under --pool process with no event loop of the worker's (--async-concurrency 0), a child
    # awaits an async handler in asyncio.run on its main thread: its stack is the coroutine's
    # (read on the child's loop), not that thread's select().
    with executor_on(backend) as service:
        where = Backend(backend, service.settings.KEY_PREFIX)
        options = ("--pool", "process", "--max-pool-size", "1", "--async-concurrency", "0")
        workers.start(where, *options, lease_timeout=LEASE)
        info = service.submit("demo.async_journal", {"record": True, "sleep": SLEEP})
        wait_until(lambda: executions(where, info.task_id).exists(), 15, "no async start")
        answer = wait_for_answer(service, info.task_id, service.request_stack(info.task_id))
        child = executions(where, info.task_id).get().pid
        assert answer.running and answer.where == f"child process {child}"
        lines = answer.stack.splitlines()
        handler = next(i for i, line in enumerate(lines) if line.endswith(", in async_journal"))
        assert lines[handler + 1].strip() == 'await asyncio.sleep(float(param["sleep"]))'
        assert "_run_once" not in answer.stack and answer.rss_bytes > 10 * 2**20
