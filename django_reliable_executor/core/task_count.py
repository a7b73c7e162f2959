"""How many tasks a filter lists, as far as a bounded count went (``count_tasks``)."""

from __future__ import annotations

from typing import NamedTuple


class TaskCount(NamedTuple):
    """``n`` tasks match; ``complete`` False when the count stopped at its bound (the cap it
    was given, or the entries a Redis parameter search reads at most): then ``n`` or more."""

    n: int
    complete: bool = True

    def words(self) -> str:
        """E.g. "12,000", or "at least 100,000" for an incomplete count."""
        return f"{self.n:,}" if self.complete else f"at least {self.n:,}"
