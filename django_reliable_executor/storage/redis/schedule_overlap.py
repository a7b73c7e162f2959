"""overlap="skip" in the Redis fire script (schedule_fire.lua): its argument and its reply."""

from __future__ import annotations

from typing import Any

from .codec import text


def overlap_flag(overlap: str) -> str:
    """schedule_fire.lua's overlap value of a fire: "skip", or "" (fire whatever runs)."""
    return "skip" if overlap == "skip" else ""


def overlap_skipped(
    schedule_id: str, reply: Any, overlapped: list[tuple[str, str, int]] | None
) -> bool:
    """Whether the fire script skipped this fire for overlap ([2, running task id, runs]);
    then (schedule id, running task id, runs skipped) goes to ``overlapped``."""
    if not reply or int(reply[0]) != 2:
        return False
    if overlapped is not None:
        overlapped.append((schedule_id, text(reply[1]), int(reply[2])))
    return True
