"""What the parts of a claim (the rate log, the key parking) ask of the storage they claim for."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ...core.clock import Clock
from ...core.flow_limits import FlowLimits
from ...core.records import Claim
from .rows import Pick

T = TypeVar("T")


class KeyChoice(Protocol):
    """What the rate log asks of the key parking (key_parking.KeyParking): the tasks of keys
    with free slots, chosen under the name's lock."""

    def choose(self, cursor: Any, pick: Pick, key_cap: int, room: int) -> tuple[str, ...]: ...


class ClaimStatements(Protocol):
    """What the rate log asks of the storage it claims for (DatabaseAccess and Claiming), by
    name: the connection, the SQL helpers and the claiming statements."""

    alias: str
    clock: Clock
    flow_limits: FlowLimits
    rate_free_at: float | None

    @property
    def _key_parking(self) -> KeyChoice: ...  # the claim of names with a per-key cap
    @property
    def vendor(self) -> str: ...
    @property
    def _table(self) -> str: ...
    @property
    def _not_paused_sql(self) -> str: ...
    @property
    def _mariadb(self) -> bool: ...
    def _dt(self, value: dt.datetime) -> Any: ...
    def _retrying(self, operation: Callable[[], T]) -> T: ...
    def _lock_name(self, cursor: Any, table: str, name: str) -> None: ...
    def _held(self, cursor: Any, name: str, now: dt.datetime) -> int: ...
    def _take(self, pick: Pick) -> list[Claim]: ...
    def _take_keyed(self, pick: Pick) -> tuple[list[Claim], list[str]]: ...
    def _take_logged(self, pick: Pick, logged_at: dt.datetime) -> tuple[list[Claim], list[str]]: ...
    def _pick_sql(
        self, pick: Pick, priorities: Sequence[int] | None = None, examined: int | None = None
    ) -> tuple[str, list[Any]]: ...
    def _claim_update_sql(self, pick: Pick, returning: str) -> tuple[str, str, list[Any]]: ...
