"""max_concurrency and rate_limit across Redis shards (REDIS_SHARDS = 3) under two real
runexecutor processes: demo.capped (max_concurrency=2) and demo.rated (rate_limit="5/s"), each
submitted to two queues of two other shards than their own queue's, never run more than two
at once nor start more than five in a second, by the handlers' own records; every task runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.storage.redis import RedisStorage
from tests.conftest import own_key_prefix, require
from tests.support.processes import (
    FAST,
    Backend,
    most_in_a_window,
    peak_overlap,
    read_journal,
    service_for,
    wait_until,
)

# "default", the two names' own queue, is of shard 1: their home. The workers serve only
# "orphan" (shard 0) and "prio" (shard 2): they claim these queues on the home shard too.
QUEUES = ("orphan", "prio")
HOME = 1
WORKER = ("--burst", "--queues", ",".join(QUEUES), "--core-pool-size", "4")


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """Redis only: a key prefix of this test's own, its shards' keys deleted afterwards."""
    with own_key_prefix(True) as prefix:
        yield prefix


def test_two_workers_keep_one_cap_and_one_rate_over_queues_of_three_shards(
    key_prefix, workers, tmp_path: Path
):
    require("redis")
    backend = Backend("redis", key_prefix, shards=3)
    service = service_for(backend)
    storage = service.storage
    assert isinstance(storage, RedisStorage)
    assert [storage.layout.shard_of(q) for q in ("default", *QUEUES)] == [HOME, 0, 2]
    requests = [
        TaskSubmitRequest("demo.capped", {"sleep": 0.15}, queue=QUEUES[i % 2]) for i in range(12)
    ]
    requests += [TaskSubmitRequest("demo.rated", {}, queue=QUEUES[i % 2]) for i in range(20)]
    requests += [TaskSubmitRequest("demo.echo", i, queue=QUEUES[i % 2]) for i in range(20)]
    infos = service.submit_many(requests)
    capped, rated, others = infos[:12], infos[12:32], infos[32:]
    for info in capped + rated:  # on the home shard, under their own queues
        assert storage.client.exists(storage._tkey(info.task_id, HOME)), info
    journal = tmp_path / "journal.jsonl"
    env = {"RE_JOURNAL": str(journal)}
    started = [workers.start(backend, *WORKER, env=env, **FAST) for _ in range(2)]

    def finished() -> bool:
        return all(p.returncode is not None for p in started)

    wait_until(finished, 120, "the burst workers did not finish", logs=workers.logs)
    assert [p.returncode for p in started] == [0, 0], workers.logs()
    ids = [info.task_id for info in capped + rated + others]
    done = storage.get_many(ids)
    assert {t.status for t in done.values()} == {TaskStatus.COMPLETED}, workers.logs()
    assert len(done) == len(ids)
    # Both workers ran some of them (claimed on the home shard through both queues).
    results: list[dict[str, Any]] = [done[i.task_id].result for i in capped]
    intervals = [(r["started"], r["ended"]) for r in results]
    assert peak_overlap(intervals) <= 2, sorted(intervals)
    assert {done[i.task_id].queue for i in capped} == set(QUEUES)
    records = read_journal(journal)
    handler_at = {r["task"]: r["at"] for r in records if r["event"] == "start"}
    assert sorted(handler_at) == sorted(i.task_id for i in rated)
    # As in test_rate_limits.py: the stored starts of any six span more than W + margin / 2;
    # the handlers' own clocks the same, less the longest delay from a start to its handler.
    written = {t: done[t].started_at.timestamp() for t in handler_at}
    assert most_in_a_window(list(written.values()), 1.05 - 0.002) <= 5, sorted(written.values())
    delay = max(0.0, max(handler_at[t] - written[t] for t in handler_at))
    window = min(1.0, 1.05 - delay - 0.002)
    starts = list(handler_at.values())
    assert most_in_a_window(starts, window) <= 5, (delay, sorted(starts))
    assert max(starts) - min(starts) >= 3.0  # 20 starts at 5 a second: one rate, not two
    service.storage.close()
