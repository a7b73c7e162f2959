"""Rate limits: parsing ``rate_limit="N/s"``, the rule of keys, and the start margin.

A rate limit of N per window W promises that at most N tasks of a name (per ``rate_key``) have
their handler called within any W seconds, as the handlers themselves would see it with
``time.time()``. The storage enforces it with a sliding log per (name, rate key):

- a claim takes a task only while fewer than N entries are in the log's window, and logs one
  at the claim's time, atomically with the claim (so concurrent workers never share room);
- the start (the storage's start write, or the claim itself where it starts the task) of a
  claim that waited in its worker longer than half the margin (``fresh_seconds``) moves the
  entry to the start's time, and refuses to start, handing the task back, when the entry has
  already left the window (the claim waited longer than that). Moving an entry that every
  claim since has counted keeps it counted, so room is never taken twice. A claim started
  sooner keeps its entry: its handler still begins within the margin of it. A claim that
  leaves its window at most half full may log its entry ahead (``lead_seconds``), about when
  it will start: an entry later than its start only counts longer;
- the handler is called shortly after its start write, but not at the same instant (the
  ``task_started`` signal, the parameter's conversion and the thread's scheduling come
  between), and two starts W apart could have handlers a little closer than W. So the log
  keeps entries for ``W + margin`` (``log_window_seconds``): two handler calls closer than W
  come from starts closer than ``W + margin`` while that delay stays under the margin.

The margin is a tenth of the window, at most one second: a limit lets through at most N per
``W + margin`` (about 9 % below N/W for per-second limits, under 2 % for per-minute ones).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from .ids import MAX_ID_LENGTH
from .text import unstorable_char

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_RATE_KEY_LENGTH = MAX_ID_LENGTH  # the rate key column's width
MAX_MARGIN_SECONDS = 1.0
_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*([smh])\s*$")


@dataclasses.dataclass(frozen=True)
class RateLimit:
    """At most ``count`` starts in any ``window_seconds``."""

    count: int
    window_seconds: float

    @property
    def margin_seconds(self) -> float:
        return min(self.window_seconds / 10, MAX_MARGIN_SECONDS)

    @property
    def fresh_seconds(self) -> float:
        """A claim started within this time of its logging starts without moving its entry:
        half the margin, leaving the other half for the way from the start to the handler."""
        return self.margin_seconds / 2

    @property
    def lead_seconds(self) -> float:
        """How far ahead of its claim a claim made while its window is at most half full logs
        its entry: half the window, at most one second, at least the margin. About when it
        starts at the latest after waiting in its worker's local queue (a full local queue of
        a busy worker on a slow machine holds a claim a few hundred milliseconds), so that its
        start need not move the entry. Logging later only counts it longer."""
        return max(self.margin_seconds, min(self.window_seconds / 2, MAX_MARGIN_SECONDS))

    def has_room_to_lead(self, used: int) -> bool:
        """Whether ``used`` entries (this claim's included) leave the window at most half
        full: the claim may then log its entries ``lead_seconds`` ahead."""
        return used * 2 <= self.count

    @property
    def log_window_seconds(self) -> float:
        """How long the storage counts a claim against the limit (window + margin)."""
        return self.window_seconds + self.margin_seconds

    def __str__(self) -> str:
        unit = {1.0: "s", 60.0: "m", 3600.0: "h"}[self.window_seconds]
        return f"{self.count}/{unit}"


def parse_rate_limit(value: Any) -> RateLimit:
    """``"N/s"``, ``"N/m"`` or ``"N/h"`` (N >= 1) as a RateLimit; ValueError naming
    ``rate_limit`` otherwise."""
    match = _PATTERN.match(value) if isinstance(value, str) else None
    if match is None or int(match.group(1)) < 1:
        raise ValueError(
            f'rate_limit must be a string "N/s", "N/m" or "N/h" with N >= 1, got {value!r}'
        )
    return RateLimit(int(match.group(1)), UNITS[match.group(2)])


def key_problem(option: str, value: Any) -> str | None:
    """Why ``value`` is no good key for ``option`` (``rate_key``, ``concurrency_key``; None:
    it is, or it is None: no key). Both keys are stored in columns as wide as a task id."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_RATE_KEY_LENGTH:
        return (
            f"{option} must be None or a string of 1..{MAX_RATE_KEY_LENGTH} characters, "
            f"got {value!r}"
        )
    problem = unstorable_char(value)
    if problem is not None:
        return f"{option} contains {problem}, which no storage can hold: got {value[:100]!r}"
    return None
