"""Round-robin fairness (``fairness="round_robin"``): which key a task counts under, and the
round each new task of a fair name gets, so that claims take the keys in turn.

Each waiting task of a fair name carries a round number; claims take a priority's due tasks
in round order (then the oldest first), so one task of each key with due work goes before
the second of any. A key's next task gets the round after its last one, but never a round
the name's claims have already passed (``current``: the lowest round among its due waiting
tasks), so a key that was idle joins the round being served instead of jumping ahead of it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

ROUND_ROBIN = "round_robin"


def fair_key(concurrency_key: str | None, rate_key: str | None) -> str:
    """The key a task of a fair name takes turns under: its ``concurrency_key``, else its
    ``rate_key``, else "" (every task without one shares one turn)."""
    return concurrency_key or rate_key or ""


def number_rounds(
    keys: Iterable[str], next_rounds: Mapping[str, int], current: int
) -> tuple[list[int], dict[str, int]]:
    """The round of each new task (its key in ``keys``, in submit order) and each key's next
    round after them, from ``next_rounds`` (a key's next round so far; absent: none yet) and
    ``current``."""
    nexts: dict[str, int] = {}
    rounds = []
    for key in keys:
        start = nexts.get(key)
        if start is None:
            start = max(next_rounds.get(key, 0), current)
        rounds.append(start)
        nexts[key] = start + 1
    return rounds, nexts


class FairRoom:
    """What one claim may still take of the fair names (``ClaimRequest.fair_limit``: a
    worker's threads free to start them now; None: no bound), as the claim goes name by
    name."""

    def __init__(self, limit: int | None, fair: Collection[str]) -> None:
        self._left = limit
        self._fair = fair

    def of(self, name: str, room: int) -> int:
        """``room``, no more than what is left for a fair name."""
        if self._left is None or name not in self._fair:
            return room
        return min(room, self._left)

    def took(self, name: str, count: int) -> None:
        if self._left is not None and name in self._fair:
            self._left -= count
