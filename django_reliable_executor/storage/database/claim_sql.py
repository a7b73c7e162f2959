"""The claim's SQL on the databases: which rows a pick chooses, in pickup order, and the
claiming UPDATE that takes them (the statements; claiming.py runs them)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from django.db import connections

from ...models import ReliablePausedQueue
from .access import DatabaseAccess
from .rows import Pick

# PostgreSQL: a claim commits without waiting for its WAL flush (synchronous_commit off for
# this transaction alone), which saves a disk flush per claim round. Safe: a claim lost in a
# server crash only frees the task again, and nothing follows from a claim before its start,
# whose own (synchronous) commit flushes the WAL up to and past the claim's; a start after a
# lost claim fails its token check. The one-row CTE runs before the first row is claimed.
ASYNC_COMMIT_CTE = (
    "relaxed AS MATERIALIZED "
    "(SELECT set_config('synchronous_commit', 'off', true) AS relaxed_commit)"
)


class ClaimSql(DatabaseAccess):
    """The SQL of a claim: ``_pick_sql`` (the due rows a pick chooses) and ``_claim_update_sql``
    (the UPDATE that claims them), with the per-vendor details they depend on."""

    def _lane(self, pick: Pick) -> str | None:
        """The claim index's range (``limited_name``) the pick reads, or None: the name's tasks
        wherever they are."""
        if pick.name is None:
            return ""
        if pick.name in self.flow_limits.names():
            # A limited name's claim reads its own range of the claim index. (Its tasks stored
            # without it, by a process that did not know the limits, wait for the master's
            # chores to move them there: mark_limited.)
            return pick.name
        # Limits the registry does not know (given to claim() directly): the name's tasks
        # wherever they are, found by name.
        return None

    def _pick_sql(
        self,
        pick: Pick,
        priorities: Sequence[int] | None = None,
        examined: int | None = None,
    ) -> tuple[str, list[Any]]:
        """The due, unclaimed rows the pick chooses, in pickup order (served by the claim
        index); only of ``priorities`` (each one range of the index: see claim_ranges.py),
        the read stopped after ``examined`` index entries (MariaDB)."""
        marks = ", ".join(["%s"] * len(pick.queues))
        names_sql, names = "", []
        lane_sql, lane = "", list[Any]()
        lane_value, hint = self._lane(pick), ""
        if lane_value is not None:
            lane_sql, lane, hint = "AND limited_name = %s ", [lane_value], self._claim_index
        elif pick.name is not None:
            # A name's tasks wherever they wait, but parked (key_parking.py): in its own range,
            # or not marked yet.
            lane_sql, lane = "AND limited_name IN (%s, %s) ", ["", pick.name]
        if priorities:
            lane_sql += f"AND priority IN ({', '.join(['%s'] * len(priorities))}) "
            lane += list(priorities)
        if pick.name is not None:
            names_sql, names = "AND task_name = %s ", [pick.name]
        else:
            # The claim of all other names: the limited names' waiting tasks are out of its
            # range of the index, and those stored without their name are left out by name.
            if pick.excluded:
                names_sql = f"AND task_name NOT IN ({', '.join(['%s'] * len(pick.excluded))}) "
                names = list(pick.excluded)
        if pick.ids:
            names_sql += f"AND task_id IN ({', '.join(['%s'] * len(pick.ids))}) "
            names += list(pick.ids)
        sql = (
            f"FROM {self._table}{hint} WHERE available = %s {lane_sql}"
            f"AND queue IN ({marks}) "
            f"AND run_at <= %s {names_sql}{self._not_paused_sql}"
            "ORDER BY priority DESC, flow_round ASC, run_at ASC LIMIT %s"
        )
        params = [True, *lane, *pick.queues, self._dt(pick.now), *names, pick.limit]
        if examined is not None:
            sql += " ROWS EXAMINED %s"
            params.append(examined)
        return sql, params

    @functools.cached_property
    def _mariadb(self) -> bool:
        """MariaDB, not MySQL: ROWS EXAMINED (claim_ranges.py) is MariaDB's alone."""
        connection: Any = connections[self.alias]  # a MySQL backend's wrapper knows which
        return self.vendor == "mysql" and bool(connection.mysql_is_mariadb)

    @functools.cached_property
    def _claim_index(self) -> str:
        """MariaDB: a lane's read goes by the claim index, whose order is the pickup order.
        Left to itself, it read an EXISTS of due_names by the queue's index, through the
        finished tasks, and its read stopped at ROWS EXAMINED (claim_ranges.py) with nothing
        due later."""
        return " FORCE INDEX (rexec_claim_idx)" if self._mariadb else ""

    @functools.cached_property
    def _not_paused_sql(self) -> str:
        """Leaves out the paused queues (executor.pause_queue), read in the claiming statement
        itself: a pause holds from the next claim of every worker, and the small table's
        subquery is read once per statement. No database locks its rows for the claim's FOR
        UPDATE (PostgreSQL and MariaDB lock only the rows of the outer FROM)."""
        paused = connections[self.alias].ops.quote_name(ReliablePausedQueue._meta.db_table)
        return f"AND queue NOT IN (SELECT queue FROM {paused}) "

    def _claim_update_sql(self, pick: Pick, returning: str) -> tuple[str, str, list[Any]]:
        """The claiming UPDATE ... RETURNING ``returning``: (the common table expressions it
        reads, "" on SQLite; the UPDATE; the parameters of both, in that order).

        On PostgreSQL the chosen rows are a MATERIALIZED CTE, read once. Inside ``IN (...)``
        the LIMIT did not bind: the planner may run that subquery again for each row it
        joins (a nested-loop semi-join, chosen once the table's statistics say so), and each
        run skips the rows this statement has already claimed (SKIP LOCKED, and a row this
        command updated is not locked again) so it returns the next ones: one claim for 1
        took every due task (tests/contract/test_claim_limit.py; the chaos soak's max_concurrency
        excess on PostgreSQL)."""
        postgresql = self.vendor == "postgresql"
        chosen, chosen_params = self._pick_sql(pick)
        # available is re-checked outside too: a row may change between pick and lock. On
        # SQLite as ``+available``, which no index serves: else its planner walked the claim
        # index over every waiting task (a held backlog included) to match the few chosen,
        # instead of looking them up by key (4.6 ms against 0.13 with 20 000 waiting).
        # (SQLite runs an uncorrelated IN subquery once, into a temporary index.)
        # A durable wait's fields go with the claim: the task is resumed now (a wait_for
        # whose timeout passed keeps waiting_for, which would make it look unheld).
        set_claimed = (
            f"UPDATE {self._table} SET available = %s, worker_id = %s, "
            "lease_token = lease_token + 1, lease_expires_at = %s, "
            "waiting = NULL, waiting_for = NULL "
        )
        claimed = [False, pick.worker_id, self._dt(pick.lease_until)]
        if postgresql:
            ctes = (
                f"{ASYNC_COMMIT_CTE}, chosen AS MATERIALIZED "
                f"(SELECT task_id AS chosen_id {chosen} FOR UPDATE SKIP LOCKED)"
            )
            update = (
                f"{set_claimed}FROM relaxed, chosen WHERE task_id = chosen_id "
                f"AND available = %s RETURNING {returning}"
            )
            return ctes, update, [*chosen_params, *claimed, True]
        update = (
            f"{set_claimed}WHERE task_id IN (SELECT task_id {chosen}) AND +available = %s "
            f"RETURNING {returning}"
        )
        return "", update, [*claimed, *chosen_params, True]
