"""Dependencies and batches across Redis shards (REDIS_SHARDS = 3) under real runexecutor
processes: two workers, one SIGKILLed while members end on every shard, then replaced; every
chain step starts after the one before it ended (by the handlers' own journal), each batch
counts exactly and its callbacks run once, and no message is left undelivered."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from tests.conftest import own_key_prefix, require
from tests.support.processes import FAST, Backend, read_journal, service_for, wait_until

QUEUES = ("orphan", "default", "prio")  # shards 0, 1 and 2 of 3
WORKER = ("--queues", ",".join(QUEUES), "--core-pool-size", "4", "--max-pool-size", "4")
BATCHES = 3
MEMBERS = 60
CHAINS = 4
STEPS = 6


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """Redis only: a key prefix of this test's own, its shards' keys deleted afterwards."""
    with own_key_prefix(True) as prefix:
        yield prefix


def _journal(path) -> list[dict]:
    return read_journal(path)


def test_chains_and_batches_across_shards_through_a_worker_kill(key_prefix, workers, tmp_path):
    require("redis")
    backend = Backend("redis", key_prefix, shards=3)
    service = service_for(backend)
    storage = service.storage
    journal = tmp_path / "journal.jsonl"
    env = {"RE_JOURNAL": str(journal)}
    pair = [workers.start(backend, *WORKER, env=env, wait_ready=False, **FAST) for _ in range(2)]
    for process in pair:
        process.wait_ready()

    def task(task_id: str, queue: str, sleep: float = 0.02) -> TaskSubmitRequest:
        return TaskSubmitRequest("demo.journal", {"sleep": sleep}, task_id=task_id, queue=queue)

    chains = [
        [task(f"c{c}-s{s}", QUEUES[(c + s) % 3]) for s in range(STEPS)] for c in range(CHAINS)
    ]
    for steps in chains:
        service.chain(steps)
    for b in range(BATCHES):
        service.submit_batch(
            [task(f"b{b}-m{i}", QUEUES[i % 3]) for i in range(MEMBERS)],
            batch_id=f"b{b}",
            on_complete=TaskSubmitRequest(
                "demo.batch_report", {"kind": "complete"}, queue=QUEUES[b % 3]
            ),
            on_success=TaskSubmitRequest(
                "demo.batch_report", {"kind": "success"}, queue=QUEUES[(b + 1) % 3]
            ),
        )
    # Killed while members end on every shard: an ending may be written and its message not
    # delivered yet (then the master delivers it), or a handler cut short (then recovered).
    victim_pid = wait_until(
        lambda: next(
            (
                r["pid"]
                for r in _journal(journal)
                if r["event"] == "end" and r["task"].startswith("b1-")
            ),
            None,
        ),
        30,
        "no member of batch b1 ended",
        logs=workers.logs,
    )
    (victim,) = [p for p in pair if p.pid == victim_pid]
    victim.kill()
    workers.start(backend, *WORKER, env=env, **FAST)

    def reports(batch_id: str) -> list[str]:
        return sorted(
            r["kind"]
            for r in _journal(journal)
            if r["event"] == "report" and r["batch"] == batch_id
        )

    chain_ids = [s.task_id for steps in chains for s in steps]
    wait_until(
        lambda: (
            all(len(reports(f"b{b}")) >= 2 for b in range(BATCHES))
            and all(t.status is TaskStatus.COMPLETED for t in storage.get_many(chain_ids).values())
        ),
        120,
        "the batches' callbacks and the chains did not all run",
        logs=workers.logs,
    )
    time.sleep(1.0)  # a late duplicate callback would show up in the journal meanwhile
    for b in range(BATCHES):
        batch = service.get_batch(f"b{b}")
        assert (batch.total, batch.completed, batch.pending, batch.finished) == (
            MEMBERS,
            MEMBERS,
            0,
            True,
        )
        assert reports(f"b{b}") == ["complete", "success"], b
    records = _journal(journal)
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    for record in records:
        if record["event"] in ("start", "end"):
            target = starts if record["event"] == "start" else ends
            target.setdefault(record["task"], []).append(record["t"])
    for steps in chains:
        for before, after in zip(steps, steps[1:], strict=False):
            assert min(starts[after.task_id]) >= max(ends[before.task_id]), (before, after)
    assert len(storage.get_many(chain_ids)) == CHAINS * STEPS
    assert [storage.client.llen(p + "outbox") for p in storage.prefixes] == [0, 0, 0]
    for process in workers.started:
        if process.alive():
            process.terminate()
            assert process.wait(15) == 0, process.log()
    storage.close()
