"""Writes a database refuses on purpose: a trigger that raises an error for the rows a test
picks, on SQLite, MariaDB and PostgreSQL alike, dropped again when the test leaves."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import connections

MESSAGE = "refused by the test"
# The heartbeat's UPDATE, and only it, moves a lease forward on a row whose status, holder and
# fencing token stay the same (a claim bumps the token; start, outcomes and hand-backs change
# the status or clear the holder).
HEARTBEAT = (
    "NEW.status = OLD.status AND NEW.lease_token = OLD.lease_token "
    "AND NEW.worker_id = OLD.worker_id AND NEW.lease_expires_at > OLD.lease_expires_at"
)


def _statements(vendor: str, name: str, table: str, event: str, condition: str) -> list[str]:
    if vendor == "postgresql":
        return [
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{MESSAGE}'; END $$",
            f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW "
            f"WHEN ({condition}) EXECUTE FUNCTION {name}()",
        ]
    if vendor == "mysql":
        return [
            f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW BEGIN "
            f"IF {condition} THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{MESSAGE}'; "
            "END IF; END"
        ]
    return [
        f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW WHEN {condition} "
        f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
    ]


def _drops(vendor: str, name: str, table: str) -> list[str]:
    if vendor == "postgresql":
        return [f"DROP TRIGGER IF EXISTS {name} ON {table}", f"DROP FUNCTION IF EXISTS {name}()"]
    return [f"DROP TRIGGER IF EXISTS {name}"]


@contextlib.contextmanager
def refused(
    alias: str, table: str, events: tuple[str, ...] = ("UPDATE",), condition: str = "1 = 1"
) -> Iterator[None]:
    """While inside: every ``events`` write (INSERT, UPDATE) to ``table`` of the rows that meet
    ``condition`` (SQL over NEW and OLD) fails with an error, for every connection."""
    connection = connections[alias]
    names = [f"re_test_refuse_{event.lower()}" for event in events]
    try:
        with connection.cursor() as cursor:
            for name, event in zip(names, events, strict=True):
                for sql in _statements(connection.vendor, name, table, event, condition):
                    cursor.execute(sql)
        yield
    finally:
        connection.close()  # a connection the test broke must not be reused for the drop
        with connection.cursor() as cursor:
            for name in names:
                for sql in _drops(connection.vendor, name, table):
                    cursor.execute(sql)
