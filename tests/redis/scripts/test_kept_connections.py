"""The connections the Redis storage keeps for its scripts: never more than KEPT_CONNECTIONS,
however many threads run scripts at once; the others go back to the client's pool."""

from __future__ import annotations

import threading
from typing import Any

from django_reliable_executor.storage.redis import RedisStorage
from django_reliable_executor.storage.redis.scripts import KEPT_CONNECTIONS
from tests.conftest import new_storage

pytest_plugins = ["tests.support.redis_servers"]  # spare_redis

THREADS = 3 * KEPT_CONNECTIONS


def test_many_threads_at_once_keep_at_most_the_cap(storage: RedisStorage):
    scripts, pool = storage._scripts, storage.client.connection_pool
    # Each thread takes its connection from the pool, then waits for all the others to hold
    # theirs: THREADS connections are out at once, every one of them a real one.
    borrow, together = scripts._get_connection, threading.Barrier(THREADS, timeout=30)
    assert borrow is not None, "a plain client: run() writes on connections it keeps"

    def held_together() -> Any:
        conn = borrow()
        together.wait()
        return conn

    scripts._get_connection = held_together
    failures: list[BaseException] = []

    def take_a_lock(n: int) -> None:
        try:
            assert storage.acquire_lock(f"kept-{n}", f"owner-{n}", 60)
        except BaseException as exc:  # noqa: BLE001 - reported by the test, not the thread
            failures.append(exc)

    threads = [threading.Thread(target=take_a_lock, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert [storage.lock_owner(f"kept-{n}") for n in range(THREADS)] == [
        f"owner-{n}" for n in range(THREADS)
    ]
    # THREADS connections were opened; the cap of them is kept, the rest went back to the pool.
    assert pool._created_connections == THREADS
    assert len(scripts._free) == KEPT_CONNECTIONS
    assert set(pool._in_use_connections) == set(scripts._free)
    assert len(pool._available_connections) == THREADS - KEPT_CONNECTIONS

    # Again, without holding them together: the kept ones are used first, none more is kept
    # and no new connection is opened.
    scripts._get_connection = borrow
    threads = [threading.Thread(target=take_a_lock, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert len(scripts._free) <= KEPT_CONNECTIONS
    assert pool._created_connections == THREADS

    storage.close()  # the kept ones go back too
    assert scripts._free == [] and not pool._in_use_connections
    assert len(pool._available_connections) == THREADS


def test_a_flushed_script_is_loaded_again_on_the_connection_in_hand(spare_redis, clock):
    """After a restart or SCRIPT FLUSH every thread's first call meets NOSCRIPT at once: each
    loads the script again on the connection it holds, opening none more."""
    server = spare_redis()
    storage = new_storage("redis", "noscript", clock=clock, redis_url=server.url)
    try:
        assert storage.acquire_lock("before", "me", 60)
        server.client().script_flush()
        scripts, pool = storage._scripts, storage.client.connection_pool
        scripts.close()  # its kept connection back to the pool: every thread borrows below
        borrow, together = scripts._get_connection, threading.Barrier(THREADS, timeout=30)
        before = pool._created_connections

        def held_together() -> Any:
            conn = borrow()
            together.wait()  # all of them out at once: the pool has none left to lend
            return conn

        scripts._get_connection = held_together
        taken: list[bool] = []
        threads = [
            threading.Thread(
                target=lambda n=n: taken.append(storage.acquire_lock(f"l{n}", "me", 60))
            )
            for n in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert taken == [True] * THREADS
        # One connection was in the pool already (the first call's); the others are new, one
        # per thread, and none more for the loads.
        assert before == 1
        assert pool._created_connections == THREADS
    finally:
        storage.close()
