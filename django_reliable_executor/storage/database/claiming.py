"""Claiming due tasks from the database storage without two workers ever taking one row."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import F

from ...records import Claim
from .access import DatabaseAccess
from .rows import (
    CLAIM_COLUMNS_SQL,
    claim_from_row,
)


class Claiming(DatabaseAccess):
    """claim: SKIP LOCKED batches, or one UPDATE ... RETURNING on SQLite."""

    def claim(
        self, worker_id: str, queues: Sequence[str], limit: int, lease_seconds: float
    ) -> list[Claim]:
        if limit <= 0 or not queues:
            return []
        now = self.clock.now()
        lease_until = now + dt.timedelta(seconds=lease_seconds)
        if self.vendor in ("sqlite", "postgresql"):
            claims = self._claim_returning(worker_id, list(queues), limit, now, lease_until)
        else:
            claims = self._retrying(
                lambda: self._claim_skip_locked(worker_id, list(queues), limit, now, lease_until)
            )
        claims.sort(key=lambda c: (-c.task.priority, c.task.run_at))
        return claims

    def _pick_sql(self, queues: list[str], limit: int, now: dt.datetime) -> tuple[str, list[Any]]:
        """The due, unclaimed rows of these queues in pickup order (served by the claim index)."""
        marks = ", ".join(["%s"] * len(queues))
        sql = (
            f"FROM {self._table} WHERE available = %s AND queue IN ({marks}) AND run_at <= %s "
            "ORDER BY priority DESC, run_at ASC LIMIT %s"
        )
        return sql, [True, *queues, self._dt(now), limit]

    def _claim_returning(
        self,
        worker_id: str,
        queues: list[str],
        limit: int,
        now: dt.datetime,
        lease_until: dt.datetime,
    ) -> list[Claim]:
        """One statement: safe on SQLite (writers serialise) and PostgreSQL (SKIP LOCKED)."""
        skip_locked = " FOR UPDATE SKIP LOCKED" if self.vendor == "postgresql" else ""
        pick, pick_params = self._pick_sql(queues, limit, now)
        sql = (
            f"UPDATE {self._table} SET available = %s, worker_id = %s, "
            "lease_token = lease_token + 1, lease_expires_at = %s "
            # available is re-checked outside too: a row may change between pick and lock.
            f"WHERE available = %s AND task_id IN (SELECT task_id {pick}{skip_locked}) "
            f"RETURNING {CLAIM_COLUMNS_SQL}"
        )
        params = [False, worker_id, self._dt(lease_until), True, *pick_params]
        with connections[self.alias].cursor() as cursor:
            cursor.execute(sql, params)
            return [claim_from_row(row) for row in cursor.fetchall()]

    def _claim_skip_locked(
        self,
        worker_id: str,
        queues: list[str],
        limit: int,
        now: dt.datetime,
        lease_until: dt.datetime,
    ) -> list[Claim]:
        """MariaDB/MySQL have no UPDATE ... RETURNING: lock a batch (reading it whole), then
        mark it by primary key, in one short transaction."""
        pick, pick_params = self._pick_sql(queues, limit, now)
        with transaction.atomic(using=self.alias):
            with connections[self.alias].cursor() as cursor:
                cursor.execute(
                    f"SELECT {CLAIM_COLUMNS_SQL} {pick} FOR UPDATE SKIP LOCKED", pick_params
                )
                rows = cursor.fetchall()
            if not rows:
                return []
            ids = [row[0] for row in rows]
            self._tasks().filter(pk__in=ids).update(
                available=False,
                worker_id=worker_id,
                lease_token=F("lease_token") + 1,
                lease_expires_at=lease_until,
            )
        claims = [claim_from_row(row) for row in rows]
        # The rows were read before the UPDATE: give them the values it wrote.
        return [
            dataclasses.replace(
                claim,
                token=claim.token + 1,
                task=dataclasses.replace(claim.task, worker_id=worker_id),
            )
            for claim in claims
        ]
