"""The one-line failure a transition's log line shows: the exception, and the worker's own
reason when it put one before the traceback (an attempt_timeout)."""

from __future__ import annotations

from django_reliable_executor.observability.announcer import _first_line


def test_a_traceback_is_summed_up_by_its_exception_line():
    text = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n'
    assert _first_line(text) == "ValueError: boom"


def test_the_worker_s_reason_before_a_traceback_is_kept():
    text = (
        "attempt timed out after 1 s (attempt_timeout): the handler raised after 1.01 s:\n"
        'Traceback (most recent call last):\n  File "x.py", line 1\nInterruptedError: stopping'
    )
    assert _first_line(text) == (
        "attempt timed out after 1 s (attempt_timeout): the handler raised after 1.01 s: "
        "InterruptedError: stopping"
    )


def test_a_one_line_message_is_itself():
    assert _first_line("lease lost") == "lease lost"
    assert _first_line(None) == "" and _first_line("  \n") == ""
