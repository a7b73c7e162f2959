"""Parameter search over 3 Redis shards: each task is in its parameter index sets on its own
shard, a search merges every shard's newest first (as the bounded scan does without the index),
a debounced join moves the entries on the task's shard, and a bulk cancel over a parameter
search walks every shard."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.parameter_filter import cut_short
from django_reliable_executor.service import bulk_actions
from django_reliable_executor.storage.redis.sharding import shard_of
from django_reliable_executor.testing import run_tasks
from tests.redis.shards.conftest import S0, S1, S2, SHARDS
from tests.redis.shards.test_debounce import key_of_home
from tests.support.admin_support import admin_params, executor_on
from tests.support.redis_support import index_problems

QUEUES = (S0, S1, S2)


def ids(tasks) -> list[str]:
    return [task.task_id for task in tasks]


@pytest.fixture
def searchable(settings) -> None:
    settings.RELIABLE_EXECUTOR = {
        **settings.RELIABLE_EXECUTOR,
        "SEARCHABLE_PARAMETERS": ["customer_id"],
    }


@pytest.mark.django_db(transaction=True, databases=["default"])
def test_a_search_merges_every_shards_index_newest_first(searchable, executor, storage, clock):
    for n in range(9):
        customer = 42 if n % 2 == 0 else 43
        executor.submit(
            "demo.echo", {"customer_id": customer}, task_id=f"t{n}", queue=QUEUES[n % 3]
        )
        clock.advance(1)
    wanted = {"customer_id": 42}
    assert ids(executor.list_tasks(parameter=wanted)) == ["t8", "t6", "t4", "t2", "t0"]
    assert ids(executor.list_tasks(parameter=wanted, limit=2, offset=1)) == ["t6", "t4"]
    assert ids(executor.list_tasks(parameter=wanted, queue=S1)) == ["t4"]
    scanned = storage.list(parameter=(("customer_id", 42),))  # no index: the bounded scan
    assert ids(scanned) == ["t8", "t6", "t4", "t2", "t0"] and not cut_short(scanned)
    for shard, prefix in enumerate(storage.prefixes):
        here = storage.client.zrange(prefix + "pidx:11:customer_id:42", 0, -1)
        assert here == [f"t{n}" for n in range(0, 9, 2) if shard_of(QUEUES[n % 3], SHARDS) == shard]
    # A debounced key whose home is shard 0, its task on S1's shard, joined from S2's queue.
    key, _ = key_of_home(0, "pidx")
    first = executor.submit("demo.echo", {"customer_id": 7}, queue=S1, debounce=10, unique_key=key)
    again = executor.submit("demo.echo", {"customer_id": 8}, queue=S2, debounce=10, unique_key=key)
    assert again.task_id == first.task_id and again.debounced
    assert executor.list_tasks(parameter={"customer_id": 7}) == []
    assert ids(executor.list_tasks(parameter={"customer_id": 8})) == [first.task_id]
    assert index_problems(storage) == []


@pytest.mark.parametrize("searchable", [(), ("customer_id",)], ids=["scan", "index"])
@pytest.mark.parametrize("backend", admin_params(["redis"]))
def test_a_bulk_cancel_over_a_parameter_search_walks_every_shard(backend, searchable):
    with executor_on(backend, REDIS_SHARDS=SHARDS, SEARCHABLE_PARAMETERS=searchable) as service:
        service.submit_many(
            [
                TaskSubmitRequest(
                    "demo.echo",
                    {"customer_id": 42 + n % 2},
                    task_id=f"p{n:02d}",
                    queue=QUEUES[n % 3],
                    delay_millis=3_600_000,
                )
                for n in range(30)
            ]
        )
        filters = {"parameter": {"customer_id": 42}}
        assert bulk_actions.count_matching(service, filters) == 15
        until = service.clock.now()
        task, _ = bulk_actions.start_bulk_action(
            service, "cancel", filters, total=15, until=until, queue="ops", chunk=4
        )
        run_tasks(queues=["ops"])
        assert service.get_task(task.task_id).result["changed"] == 15
        found = service.storage.get_many([f"p{n:02d}" for n in range(30)])
        cancelled = {i for i, t in found.items() if t.status is TaskStatus.CANCELLED}
        assert cancelled == {f"p{n:02d}" for n in range(0, 30, 2)}
        assert service.storage.layout.shards == SHARDS
        assert index_problems(service.storage) == []
