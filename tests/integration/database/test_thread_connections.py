"""A pool thread's connections between tasks: a transaction a handler left open is closed before
the thread's next task, also in a thread that had no connection open at its previous look."""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from django_reliable_executor.connections import tidy_connections
from tests.conftest import db_params, require


# Not SQLite: Django never closes its in-memory test database.
@pytest.mark.parametrize("alias", db_params(["postgres", "mariadb"]))
def test_a_transaction_left_open_is_closed_even_after_a_look_that_found_no_connection(alias):
    require(alias)
    seen: dict[str, object] = {}

    def pool_thread() -> None:
        tidy_connections()  # the first task touched no database: nothing open here
        conn = connections[alias]
        seen["before"] = conn.connection
        atomic = transaction.atomic(using=alias)
        atomic.__enter__()  # the next task opens a connection and leaves a transaction open
        seen["in_transaction"] = conn.in_atomic_block and conn.connection is not None
        tidy_connections()
        seen["closed"] = conn.closed_in_transaction  # Django's mark of a close inside atomic
        atomic.__exit__(None, None, None)

    thread = threading.Thread(target=pool_thread)
    thread.start()
    thread.join(30)
    assert seen["before"] is None
    assert seen["in_transaction"] is True
    assert seen["closed"] is True  # the transaction does not leak into the next task
