"""Delivering the shards' outboxes: a delivering process SIGKILLed between the ending and the
delivery, or between applying and removing, loses nothing and applies nothing twice; a message
that cannot be applied holds up only its target; a switch of shards waits for the outboxes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.master.chores import MasterChores
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import REDIS_URL

from .conftest import (
    LEASE,
    S0,
    S1,
    S2,
    SHARDS,
    claim,
    complete,
    due,
    fail,
    outbox_lengths,
    status,
    step,
)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


CHILD = """
import os, signal, sys, datetime as dt
import redis
from django_reliable_executor.core.clock import FakeClock
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis import access

url, prefix, shards, now, phase, queue = sys.argv[1:7]
clock = FakeClock(dt.datetime.fromisoformat(now))
storage = RedisStorage(redis.Redis.from_url(url, decode_responses=True), prefix, clock=clock,
                       shards=int(shards))

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if phase == "end":
    # Killed right after the ending script, before the delivery that follows it.
    access.RedisAccess._deliver_now = die
    claims = storage.claim("child", [queue], 100, 30.0)
    storage.complete_many([(storage.start(c, 30.0), None) for c in claims])
else:
    # Killed after the messages were applied on their shards, before their removal (the
    # pipeline of LREMs).
    storage.client.pipeline = die
    storage.deliver_messages(500)
print("not killed")
"""


def run_child(storage: RedisStorage, clock: FakeClock, phase: str, queue: str) -> None:
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, REDIS_URL, storage.key_prefix, str(SHARDS)]
        + [clock.now().isoformat(), phase, queue],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -9, (done.returncode, done.stdout, done.stderr)


def test_a_delivery_killed_at_each_step_loses_nothing_and_applies_nothing_twice(
    executor, storage, clock
):
    executor.submit("demo.echo", {}, task_id="gate", queue=S2)
    members = [step(f"m{i}", S2) for i in range(5)]
    executor.submit_batch(members, batch_id="k", on_complete=step("cb", S1))
    executor.submit("demo.echo", {}, task_id="after", queue=S1, depends_on=["gate"])
    # 1: the ending is written, its process dies before delivering.
    run_child(storage, clock, "end", S2)
    assert {status(executor, t) for t in ["gate", *(m.task_id for m in members)]} == {
        TaskStatus.COMPLETED
    }
    assert outbox_lengths(storage) == [0, 0, 6]  # 5 members and 1 dependent: nothing lost
    assert executor.get_batch("k").completed == 0
    assert status(executor, "after") is TaskStatus.CREATED
    sent = storage.client.lrange(storage.prefixes[2] + "outbox", 0, -1)
    # 2: a delivery applies them on their shards, and dies before removing them.
    run_child(storage, clock, "deliver", S2)
    assert storage.client.lrange(storage.prefixes[2] + "outbox", 0, -1) == sent
    assert due(executor, "after")
    batch = executor.get_batch("k")
    assert (batch.total, batch.completed, batch.finished_at is not None) == (5, 5, True)
    assert outbox_lengths(storage) == [1, 0, 6]  # the callback, to shard 1, not delivered
    assert executor.get_task("cb") is None
    # 3: the master's chore delivers them all again: applied once.
    applied: list[str] = []
    apply = storage._apply

    def recording(messages, target):
        applied.extend(messages)
        return apply(messages, target)

    storage._apply = recording  # type: ignore[method-assign]
    assert storage.deliver_messages(500) == 7
    assert outbox_lengths(storage) == [0, 0, 0]
    assert due(executor, "cb")
    # Every message once more, as a delivery stalled since before step 3 would: no change.
    for message in applied:
        storage.client.rpush(storage.prefixes[json.loads(message)["f"]] + "outbox", message)
    assert storage.deliver_messages(500) == 7
    batch = executor.get_batch("k")
    assert (batch.total, batch.completed, batch.failed, batch.cancelled) == (5, 5, 0, 0)
    claims = storage.claim("w1", [S1], 10, LEASE)
    assert sorted(c.task_id for c in claims) == ["after", "cb"]
    storage.release(claims)


def test_a_switch_of_shards_waits_for_undelivered_messages(executor, storage):
    from django_reliable_executor.storage.redis.resharding import check_reshard

    executor.submit_batch([step("u", S2)], batch_id="u")
    started = claim(storage, S2, "u")
    now = str(int(storage.clock.now().timestamp() * 1e6))
    storage._scripts.run(  # the ending alone: its writer died before delivering
        "complete", storage._routes[2], (storage.prefixes[2], now, "n1", "u", started.token, "1")
    )
    check = check_reshard(storage, 2)
    assert (check.unfinished, check.undelivered, check.ready) == (0, 1, False)
    assert "1 messages between shards not delivered yet" in check.problems()[0]
    assert storage.deliver_messages(500) == 1
    assert check_reshard(storage, 2).undelivered == 0
    assert executor.get_batch("u").completed == 1


def test_a_message_that_cannot_be_applied_holds_up_only_its_target(executor, storage, clock):
    executor.submit("demo.echo", {}, task_id="a", queue=S2)
    executor.submit("demo.echo", {}, task_id="b", queue=S1, depends_on=["a"])
    started = claim(storage, S2, "a")
    poison = json.dumps({"to": 7, "f": 2, "m": "0", "k": "dep", "id": "x", "d": "y", "s": "OK"})
    storage.client.rpush(storage.prefixes[2] + "outbox", poison)
    now = str(int(storage.clock.now().timestamp() * 1e6))
    storage._scripts.run(  # the ending alone, its message behind the one for no shard
        "complete", storage._routes[2], (storage.prefixes[2], now, "n1", "a", started.token, "1")
    )
    with pytest.raises(IndexError):
        storage.deliver_messages(500)
    assert due(executor, "b")  # its own target's messages went on
    assert storage.client.lrange(storage.prefixes[2] + "outbox", 0, -1) == [poison]
    # The master's round logs it and goes on with its other chores (a lease recovered).
    executor.submit("demo.echo", {}, task_id="lost", queue=S0)
    claim(storage, S0, "lost")
    clock.advance(LEASE + 1)
    MasterChores(executor, retention_seconds=3600).run_once()
    assert status(executor, "lost") is TaskStatus.PENDING
    storage.client.delete(storage.prefixes[2] + "outbox")


def test_only_an_ending_that_sent_a_message_is_followed_by_a_delivery(
    executor, storage, monkeypatch
):
    deliveries: list[int] = []
    deliver = storage._deliver_now

    def recording(shard: int) -> None:
        deliveries.append(shard)
        deliver(shard)

    monkeypatch.setattr(storage, "_deliver_now", recording)
    executor.submit("demo.echo", {}, task_id="alone", queue=S2)
    executor.submit("demo.echo", {}, task_id="near", queue=S2, depends_on=["alone"])
    executor.submit("demo.echo", {}, task_id="far", queue=S1)
    executor.submit("demo.echo", {}, task_id="after", queue=S0, depends_on=["far"])
    assert deliveries == []
    complete(storage, S2, "alone")  # its dependent on its own shard: no message
    assert deliveries == [] and due(executor, "near")
    fail(storage, S1, "far")
    assert deliveries == [1] and status(executor, "after") is TaskStatus.CANCELLED
    complete(storage, S2, "near")
    assert deliveries == [1]
