"""Live stacks of running tasks: the request and answer records, and the text of a stack.

An operator asks for the current Python stack of a running task's handler
(``executor.request_stack``); the storage keeps the request for the task's worker, whose
heartbeat thread (or, under ``--pool process``, the child running the handler) formats the
handler thread's frames and stores the answer (``executor.task_stack``). Only each frame's
file, line, function and source line are written, never its local variables: a stack shows
code paths, not data. Everything here is pure (no I/O).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import traceback
from types import FrameType
from typing import Any

from .text import storable_text

#: Most characters of a stored stack: past it, the outermost frames are left out (the
#: innermost, where the handler is, are kept).
STACK_MAX_CHARS = 64 * 1024
#: A request this old without an answer: its worker is gone or frozen (the page says so).
ANSWER_SECONDS = 5.0
#: Requests and answers are kept this long, then expire (deleted by the next request on the
#: database storage, by a TTL on Redis).
KEEP_SECONDS = 600.0
#: Most seconds between two looks for requests of a worker running tasks (databases poll).
POLL_SECONDS = 1.0
#: Most requests a worker takes at once.
TAKE_LIMIT = 20
#: A worker takes only the requests made within this many seconds (a worker resumed after a
#: long pause does not answer what nobody waits for any more).
TAKE_WITHIN_SECONDS = 60.0
#: A request for a task while an unanswered one for it, made this recently, is stored: that
#: one is waited for instead (a viewer clicking "Show stack" again, or a script asking in a
#: loop, piles up no requests: at most one unanswered request per task and this many seconds).
REUSE_SECONDS = ANSWER_SECONDS
#: What a request says when its task ended before its worker answered (``task_stack``).
ENDED_FIRST = "the task ended ({status}) before its worker answered: no handler of it runs now"


@dataclasses.dataclass(frozen=True)
class StackAnswer:
    """What a worker answered to one request for a running task's stack.

    ``running`` False: the handler was no longer running on that worker when it looked (it had
    just ended, or never ran there), and ``stack`` is empty. ``elapsed_seconds`` counts from
    the attempt's start (``TaskInfo.started_at``); ``deadline_at`` is the task's
    ``max_duration_millis`` deadline and ``attempt_timeout`` the attempt's limit in seconds
    (None: none). ``rss_bytes``: the resident memory of the child process running the handler
    (``--pool process``; None in a thread). ``where`` says which thread or process ran it."""

    request_id: str
    task_id: str
    worker_id: str
    answered_at: dt.datetime
    running: bool
    stack: str = ""
    truncated: bool = False
    elapsed_seconds: float | None = None
    deadline_at: dt.datetime | None = None
    attempt_timeout: float | None = None
    pid: int | None = None
    rss_bytes: int | None = None
    where: str = ""


@dataclasses.dataclass(frozen=True)
class StackRequest:
    """A request for the stack of ``task_id``'s handler, running on ``worker_id``; ``answer``
    once the worker answered (None until then)."""

    request_id: str
    task_id: str
    worker_id: str
    requested_at: dt.datetime
    answer: StackAnswer | None = None


def format_stack(frame: FrameType | None) -> tuple[str, bool]:
    """The stack ending at ``frame``, outermost call first, as a traceback prints it (file,
    line, function, source line; never local variables), made storable and cut to
    STACK_MAX_CHARS: ``(text, truncated)``."""
    if frame is None:
        return "", False
    summary = traceback.StackSummary.extract(
        traceback.walk_stack(frame), capture_locals=False, lookup_lines=True
    )
    summary.reverse()
    return bounded("".join(summary.format()))


def format_coroutine_stack(coroutine: Any) -> tuple[str, bool]:
    """The stack of a suspended coroutine (an async handler's, awaiting): each coroutine it
    awaits, through ``cr_await``, outermost first, down to the innermost one's ``await``; as
    ``format_stack`` formats frames. Read it only where the coroutine cannot move meanwhile
    (its event loop's thread, between two callbacks)."""
    frames: list[tuple[FrameType, int]] = []
    seen: set[int] = set()
    while coroutine is not None and id(coroutine) not in seen:
        seen.add(id(coroutine))
        frame = getattr(coroutine, "cr_frame", None) or getattr(coroutine, "gi_frame", None)
        if frame is None:  # ended, or not a coroutine (a Future awaited)
            break
        frames.append((frame, frame.f_lineno))
        coroutine = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)
    summary = traceback.StackSummary.extract(iter(frames), capture_locals=False, lookup_lines=True)
    return bounded("".join(summary.format()))


def bounded(text: str) -> tuple[str, bool]:
    """``text`` with no character a storage refuses (core/text.py), its start cut off past
    STACK_MAX_CHARS: ``(text, truncated)``."""
    text = storable_text(text)
    if len(text) <= STACK_MAX_CHARS:
        return text, False
    tail = text[-(STACK_MAX_CHARS - 100) :]
    tail = tail[tail.find("\n") + 1 :]  # from a whole line on
    return f"... ({len(text) - len(tail)} characters of outer frames left out)\n{tail}", True


def answer_to_json(answer: StackAnswer) -> str:
    """The answer as stored: JSON text (times as ISO 8601)."""
    values: dict[str, Any] = dataclasses.asdict(answer)
    for name in ("answered_at", "deadline_at"):
        if values[name] is not None:
            values[name] = values[name].isoformat()
    return json.dumps(values, ensure_ascii=False)


def answer_from_json(text: str) -> StackAnswer:
    """``answer_to_json``'s inverse."""
    values = json.loads(text)
    for name in ("answered_at", "deadline_at"):
        if values.get(name) is not None:
            values[name] = dt.datetime.fromisoformat(values[name])
    known = {field.name for field in dataclasses.fields(StackAnswer)}
    return StackAnswer(**{k: v for k, v in values.items() if k in known})
