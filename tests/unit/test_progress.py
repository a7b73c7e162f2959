"""progress and progress_writer: the check of set_progress's arguments, the stored form, and
the coalescing of reports (the latest wins, at most one write per task an interval)."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from django_reliable_executor.core.progress import (
    make_progress,
    percent,
    progress_from_json,
    progress_summary,
    progress_to_json,
)
from django_reliable_executor.worker.progress_writer import ProgressWriter

NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


def test_a_report_and_its_stored_form():
    report = make_progress(3, 10, "copying", NOW)
    assert report == {"current": 3, "total": 10, "message": "copying", "updated_at": NOW}
    assert progress_from_json(progress_to_json(report)) == report
    assert progress_to_json(None) is None and progress_from_json(None) is None
    assert (percent(report), progress_summary(report)) == (30, "3 of 10 (30%): copying")
    unknown = make_progress(2.5, None, "", NOW)
    assert (percent(unknown), progress_summary(unknown)) == (None, "2.5")
    assert percent(make_progress(0, 0, "", NOW)) == 100  # nothing to do is done


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((True, None, ""), TypeError, "current must be a number, not bool"),
        ((1, "2", ""), TypeError, "total must be a number, not str"),
        ((-0.5, None, ""), ValueError, "current must be 0 or more"),
        ((1, float("inf"), ""), ValueError, "total must be a finite number"),
        ((5, 4, ""), ValueError, "current (5) must not exceed total (4)"),
        ((1, None, None), TypeError, "message must be a str, not NoneType"),
        ((1, None, "é" * 1001), ValueError, "message must be at most 1000 characters, not 1001"),
    ],
)
def test_bad_arguments_are_named(args, error, words):
    with pytest.raises(error) as caught:
        make_progress(*args, NOW)
    assert words in str(caught.value)
    assert str(caught.value).startswith("set_progress: ")


class Recorder:
    """A write that records its batches; ``hold`` keeps a write from returning until set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.writing = threading.Event()

    def __call__(self, batch: list[int]) -> None:
        self.writing.set()
        self.hold.wait(10)
        self.batches.append(list(batch))


def test_the_first_report_is_written_the_later_ones_coalesced_and_the_last_by_finish():
    written = Recorder()
    writer = ProgressWriter(written, interval=3600.0)
    try:
        writer.put("a", 1)
        assert written.writing.wait(10)
        for value in (2, 3, 4):
            writer.put("a", value)
        assert writer.pending("a")
        writer.finish("a")
        assert written.batches == [[1], [4]]
        assert not writer.pending("a")
        writer.finish("a")  # nothing pending: no write
        assert written.batches == [[1], [4]]
    finally:
        writer.close()


def test_finish_waits_for_a_report_being_written_so_none_lands_after_it():
    written = Recorder()
    written.hold.clear()
    writer = ProgressWriter(written, interval=3600.0)
    try:
        writer.put("a", 1)
        assert written.writing.wait(10)  # the thread is writing report 1 now
        assert writer.pending("a")  # in flight: finish() must wait for it
        finished = threading.Event()
        thread = threading.Thread(target=lambda: (writer.finish("a"), finished.set()))
        thread.start()
        assert not finished.wait(0.2)
        written.hold.set()
        thread.join(10)
        assert finished.is_set() and written.batches == [[1]]
    finally:
        written.hold.set()
        writer.close()


def test_a_failing_write_is_logged_not_raised(caplog):
    def broken(batch: list[int]) -> None:
        raise ConnectionError("down")

    writer = ProgressWriter(broken, interval=3600.0)
    writer.put("a", 1)
    writer.put("b", 2)
    writer.finish("a")
    writer.finish("b")
    writer.close()
    assert "could not write the progress" in caplog.text
