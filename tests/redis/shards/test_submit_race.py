"""Multi-shard submits racing each other for unique keys: each call is all or nothing, one
task per key, whoever wins."""

from __future__ import annotations

import threading

import pytest

from django_reliable_executor import InvalidDependencyError, TaskSubmitError, TaskSubmitRequest
from django_reliable_executor.core.uniqueness import unique_digest
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.sharding import unique_home

from .conftest import S0, S1, S2, complete, step

pytestmark = pytest.mark.django_db(transaction=True, databases=["default"])

ROUNDS = 100


def _chain(
    executor: ReliableExecutor,
    steps: list[TaskSubmitRequest],
    barrier: threading.Barrier,
    outcomes: dict[str, str],
    name: str,
    how: str = "chain",
) -> None:
    barrier.wait()
    try:
        getattr(executor, how)(steps)
        outcomes[name] = "stored"
    except (InvalidDependencyError, TaskSubmitError):
        outcomes[name] = "refused"


def _race(
    executor: ReliableExecutor, storage: RedisStorage, chains: dict[str, list[TaskSubmitRequest]]
) -> dict[str, str]:
    """Submit each chain in a thread of its own, all at once; check none is stored in part."""
    barrier = threading.Barrier(len(chains))
    outcomes: dict[str, str] = {}
    threads = [
        threading.Thread(target=_chain, args=(executor, steps, barrier, outcomes, name))
        for name, steps in chains.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for name, steps in chains.items():
        ids = [one.task_id for one in steps]
        stored = sorted(storage.get_many(ids))
        assert stored == (sorted(ids) if outcomes[name] == "stored" else []), (name, stored)
    return outcomes


def test_two_chains_over_three_shards_racing_for_a_unique_key_store_all_or_nothing(
    executor: ReliableExecutor, storage: RedisStorage
):
    """Each round two chains of 3 steps on 3 shards whose middle step takes the round's
    unique key (its home varies with the round, and is sometimes the step's own shard): the
    one that loses the key is refused, and leaves no step behind."""
    for n in range(ROUNDS):
        key = f"k{n}"
        chains = {
            name: [
                step(f"{name}{n}-0", queues[0]),
                step(f"{name}{n}-1", queues[1], unique_for=60, unique_key=key),
                step(f"{name}{n}-2", queues[2]),
            ]
            for name, queues in (("a", (S0, S1, S2)), ("b", (S2, S0, S1)))
        }
        outcomes = _race(executor, storage, chains)
        assert sorted(outcomes.values()) == ["refused", "stored"], (n, outcomes)


def test_two_chains_taking_two_unique_keys_in_opposite_orders_store_all_or_nothing(
    executor: ReliableExecutor, storage: RedisStorage
):
    """Each round two chains of 4 steps take the same two keys in opposite orders in their
    middle steps: neither waits for the other for ever (nor takes a key the other holds), one
    is stored whole, the other refused whole, and each key has the winner's task."""
    for n in range(ROUNDS // 2):
        one, two = f"k{n}", f"j{n}"
        chains = {
            "a": [
                step(f"a{n}-0", S0),
                step(f"a{n}-1", S1, unique_for=60, unique_key=one),
                step(f"a{n}-2", S2, unique_for=60, unique_key=two),
                step(f"a{n}-3", S0),
            ],
            "b": [
                step(f"b{n}-0", S2),
                step(f"b{n}-1", S0, unique_for=60, unique_key=two),
                step(f"b{n}-2", S1, unique_for=60, unique_key=one),
                step(f"b{n}-3", S2),
            ],
        }
        outcomes = _race(executor, storage, chains)
        assert sorted(outcomes.values()) == ["refused", "stored"], (n, outcomes)
        winner = "a" if outcomes["a"] == "stored" else "b"
        for key in (one, two):
            holder = storage.unique_holder(unique_digest("demo.echo", key, {}))
            assert holder is not None and holder.task_id.startswith(winner), (n, key, holder)


def _submit_one(
    executor: ReliableExecutor,
    request: TaskSubmitRequest,
    barrier: threading.Barrier,
    outcomes: dict[str, str],
) -> None:
    barrier.wait()
    try:
        executor.submit_many([request])
        outcomes["one"] = "stored"
    except TaskSubmitError:
        outcomes["one"] = "refused"


@pytest.mark.parametrize("how", ["chain", "submit_many"])
def test_a_call_over_three_shards_racing_a_submit_of_its_middle_id_elsewhere_is_whole(
    executor: ReliableExecutor, storage: RedisStorage, how: str
):
    """Each round a chain (or a call without dependencies) over 3 shards races a submit of
    its middle task's task_id to a queue of another shard: the call is stored whole (its
    middle task perhaps the other submit's, which its last step then waits for) or refused
    whole."""
    for n in range(3 * ROUNDS):  # (the window is narrower than the unique key's)
        middle = f"x{n}"
        chain = [step(f"a{n}-0", S0), step(middle, S1), step(f"a{n}-2", S2)]
        barrier = threading.Barrier(2)
        outcomes: dict[str, str] = {}
        threads = [
            threading.Thread(target=_chain, args=(executor, chain, barrier, outcomes, "a", how)),
            threading.Thread(
                target=_submit_one, args=(executor, step(middle, S2), barrier, outcomes)
            ),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(outcomes) == 2, (n, outcomes)
        stored = sorted(storage.get_many([f"a{n}-0", f"a{n}-2"]))
        expected = [f"a{n}-0", f"a{n}-2"] if outcomes["a"] == "stored" else []
        assert stored == expected, (n, outcomes, stored)
        assert storage.get(middle) is not None


def test_a_key_reserved_on_its_own_shard_is_free_again_once_its_task_ended(
    executor: ReliableExecutor, storage: RedisStorage
):
    """A chain over 3 shards holds a unique key on its home, the step's own shard, as a
    reservation entry; once that task ended, a call of one shard storing the key again and a
    dependent of it is stored (the entry's ended task does not hold the key)."""
    key = next(k for k in (f"k{n}" for n in range(100)) if _home(k) == 1)  # S1's shard
    executor.chain([step("a", S0), step("b", S1, unique_for=60, unique_key=key), step("c", S2)])
    complete(storage, S0, "a")
    complete(storage, S1, "b")
    created = executor.submit_many(
        [step("d", S1, unique_for=60, unique_key=key), step("e", S1, depends_on=["d"])]
    )
    assert [task.task_id for task in created] == ["d", "e"]
    assert storage.unique_holder(unique_digest("demo.echo", key, {})) == executor.get_task("d")
    complete(storage, S2, "c")


def test_a_key_reserved_for_a_task_of_another_shard_is_free_again_once_it_ended(
    executor: ReliableExecutor, storage: RedisStorage
):
    """A key whose home is shard 1 taken by a task of shard 0 (a reservation entry there);
    once that task ended, a call of shard 1 storing the key again and a dependent of it is
    stored, not refused as depending on a task it does not store."""
    key = next(k for k in (f"k{n}" for n in range(100)) if _home(k) == 1)  # S1's shard
    executor.submit_many([step("a", S0, unique_for=60, unique_key=key)])
    complete(storage, S0, "a")
    created = executor.submit_many(
        [step("d", S1, unique_for=60, unique_key=key), step("e", S1, depends_on=["d"])]
    )
    assert [task.task_id for task in created] == ["d", "e"]
    assert storage.unique_holder(unique_digest("demo.echo", key, {})) == executor.get_task("d")


def _home(key: str) -> int:
    return unique_home(unique_digest("demo.echo", key, {}), 3)
