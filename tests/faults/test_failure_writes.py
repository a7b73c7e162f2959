"""A worker's failure write meets a connection the database server ended (a restart, a failover,
a proxy's timeout): the write is made again on a new connection, so the task fails once, as its
retry policy says, instead of waiting for lease recovery and running its handler again. Found by
the chaos soak (bench/chaos_soak.py) on MariaDB and PostgreSQL."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import BACKENDS, db_params, require
from tests.support.processes import Backend, executions, service_for, wait_until


@pytest.mark.parametrize("alias", db_params(BACKENDS))
def test_a_failure_write_on_a_connection_the_server_ended_is_written_again(
    alias, key_prefix, workers
):
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    ids = [f"killed-{i}" for i in range(3)]
    for task_id in ids:
        service.submit("demo.fails_on_a_killed_connection", task_id=task_id, retry_limit=2)
    # A short lease: had a failure not been written, recovery would run its task again soon.
    workers.start(backend, "--max-pool-size", "1", "--core-pool-size", "1", lease_timeout=3)

    def ended() -> bool:
        tasks = service.storage.get_many(ids)
        return len(tasks) == len(ids) and all(task.is_terminal for task in tasks.values())

    wait_until(ended, 60, "the tasks did not end", logs=workers.logs)
    for task_id, info in service.storage.get_many(ids).items():
        assert info.status is TaskStatus.FAILED, (task_id, info.last_error, workers.logs())
        assert info.attempts == 1, (task_id, info.last_error)
        assert "NotRetried: failed after the server ended its connection" in info.last_error
        # The handler's own record: one run, not a second one after the lease lapsed.
        assert executions(backend, task_id).count() == 1, workers.logs()
