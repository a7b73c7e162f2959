"""AttemptTimer: a limit expires once, at its time, unless its attempt finished first; the
answer to "did it time out" is decided once; a failing expiry does not stop the timer."""

from __future__ import annotations

import threading
import time

from django_reliable_executor.worker import attempt_limits
from django_reliable_executor.worker.attempt_limits import AttemptTimer


def test_a_limit_expires_at_its_time_and_finish_says_so():
    timer = AttemptTimer()
    fired = threading.Event()
    began = time.monotonic()
    limit = timer.arm(0.1, fired.set)
    assert fired.wait(5)
    assert time.monotonic() - began >= 0.1
    assert timer.finish(limit) is True
    assert timer.finish(limit) is True  # asked again: the same answer
    assert timer.armed() == 0


def test_an_attempt_that_finished_in_time_never_expires():
    timer = AttemptTimer()
    fired = threading.Event()
    limit = timer.arm(0.1, fired.set)
    assert timer.finish(limit) is False
    assert not fired.wait(0.3)
    assert timer.finish(limit) is False
    assert timer.armed() == 0


def test_limits_expire_in_the_order_of_their_times_whatever_the_order_armed():
    timer = AttemptTimer()
    order: list[str] = []
    done = threading.Event()
    timer.arm(0.3, lambda: (order.append("late"), done.set()))
    timer.arm(0.05, lambda: order.append("early"))  # wakes the thread waiting for "late"
    timer.arm(0.15, lambda: order.append("middle"))
    assert done.wait(5)
    assert order == ["early", "middle", "late"]


def test_a_failing_expiry_is_logged_and_the_timer_goes_on(caplog):
    timer = AttemptTimer()
    fired = threading.Event()

    def broken() -> None:
        raise RuntimeError("expiry failed")

    timer.arm(0.01, broken)
    timer.arm(0.1, fired.set)
    assert fired.wait(5)
    assert "its expiry failed" in caplog.text


def test_finished_limits_do_not_pile_up(monkeypatch):
    monkeypatch.setattr(attempt_limits, "COMPACT_AT", 8)
    timer = AttemptTimer()
    for _ in range(100):
        timer.finish(timer.arm(3600, lambda: None))
    assert len(timer._heap) <= 2 * 8 + 1
    assert timer.armed() == 0
