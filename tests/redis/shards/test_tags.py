"""Tags over the shards of a sharded Redis storage: each task is in its tags' sets on its own
shard, a listing by tag merges every shard's newest first, and the purge empties the sets."""

from __future__ import annotations

import datetime as dt

from django_reliable_executor.storage.redis.sharding import shard_of

from .conftest import S0, S0B, S1, S2, SHARDS, complete


def tag_sets(storage) -> dict[int, dict[str, list[str]]]:
    """Per shard: each ``tag:`` set's members."""
    found: dict[int, dict[str, list[str]]] = {}
    for shard, prefix in enumerate(storage.prefixes):
        for key in storage.client.scan_iter(match=prefix.replace("{", "\\{") + "tag:*"):
            members = [
                m.decode() if isinstance(m, bytes) else m for m in storage.client.zrange(key, 0, -1)
            ]
            found.setdefault(shard, {})[key[len(prefix) :]] = members
    return found


def test_tags_live_on_each_tasks_shard_and_list_across_shards(executor, storage, clock):
    for task_id, queue in (("a", S0), ("b", S1), ("c", S2)):
        executor.submit("demo.echo", None, task_id=task_id, queue=queue, tags=["import"])
        clock.advance(1)
    executor.submit("demo.echo", None, task_id="d", queue=S0B, tags=["other"])
    homes = {queue: shard_of(queue, SHARDS) for queue in (S0, S1, S2)}
    assert len(set(homes.values())) == 3
    assert tag_sets(storage) == {
        homes[S0]: {"tag:import": ["a"], "tag:other": ["d"]},  # (S0B is on S0's shard)
        homes[S1]: {"tag:import": ["b"]},
        homes[S2]: {"tag:import": ["c"]},
    }
    assert [t.task_id for t in executor.list_tasks(tag="import")] == ["c", "b", "a"]
    assert [t.task_id for t in executor.list_tasks(tag="import", limit=1, offset=1)] == ["b"]
    assert [t.task_id for t in executor.list_tasks(tag="import", queue=S0)] == ["a"]
    for task_id, queue in (("a", S0), ("b", S1), ("c", S2)):
        complete(storage, queue, task_id)
    clock.advance(10)
    assert storage.purge_finished(clock.now() - dt.timedelta(seconds=1), 10) == 3
    assert tag_sets(storage) == {homes[S0]: {"tag:other": ["d"]}}
    assert executor.list_tasks(tag="import") == []
