"""retries: the backoff between attempts and the state a failed attempt leads to."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.retries import JITTER, after_failure, backoff_millis

UTC = dt.timezone.utc
NOW = dt.datetime(2030, 1, 1, tzinfo=UTC)
S = TaskStatus


# -- retries.backoff_millis -------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 5, 100])
def test_fixed_backoff_is_the_interval_for_every_retry(n):
    assert backoff_millis(n, 1500, "fixed", 10, rand=lambda: 0.0) == 1500


@pytest.mark.parametrize(("n", "nominal"), [(1, 1000), (2, 2000), (3, 4000), (6, 32000)])
def test_exponential_backoff_doubles(n, nominal):
    assert backoff_millis(n, 1000, "exponential", 10**9, rand=lambda: 0.5) == nominal
    assert backoff_millis(n, 1000, "exponential", 10**9, rand=lambda: 0.0) == int(nominal * 0.9)
    assert backoff_millis(n, 1000, "exponential", 10**9, rand=lambda: 1.0) == int(nominal * 1.1)


def test_exponential_backoff_jitter_stays_within_ten_percent():
    rng = random.Random(7)
    delays = [backoff_millis(3, 1000, "exponential", 10**9, rand=rng.random) for _ in range(2000)]
    assert JITTER == 0.10
    assert min(delays) >= 3600
    assert max(delays) <= 4400
    assert len(set(delays)) > 100  # actually spread out


def test_exponential_backoff_is_capped_and_jitter_never_exceeds_the_cap():
    assert backoff_millis(10, 1000, "exponential", 60000, rand=lambda: 0.5) == 60000
    assert backoff_millis(10, 1000, "exponential", 60000, rand=lambda: 1.0) == 60000
    assert backoff_millis(10, 1000, "exponential", 60000, rand=lambda: 0.0) == 54000


def test_exponential_backoff_with_a_huge_retry_number_stays_capped():
    assert backoff_millis(10**9, 1000, "exponential", 300000, rand=lambda: 0.5) == 300000


def test_zero_interval_is_zero_delay():
    assert backoff_millis(4, 0, "exponential", 300000, rand=lambda: 1.0) == 0
    assert backoff_millis(4, 0, "fixed", 300000) == 0


def test_backoff_rejects_bad_arguments():
    with pytest.raises(ValueError, match="starts at 1"):
        backoff_millis(0, 1000, "fixed", 1000)
    with pytest.raises(ValueError, match="linear"):
        backoff_millis(1, 1000, "linear", 1000)


# -- retries.after_failure --------------------------------------------------------------------
def _after(**overrides: Any):
    arguments = dict(
        budget_attempts=1,
        retry_limit=3,
        retryable=True,
        cancel_requested=False,
        deadline_at=None,
        now=NOW,
        retry_interval=2000,
        retry_backoff="fixed",
        backoff_cap_millis=300000,
    )
    arguments.update(overrides)
    return after_failure(**arguments)


def test_after_failure_with_retries_left_is_pending_after_backoff():
    assert _after() == (S.PENDING, NOW + dt.timedelta(seconds=2))
    assert _after(budget_attempts=3) == (S.PENDING, NOW + dt.timedelta(seconds=2))


def test_after_failure_with_exponential_backoff_uses_the_budget_attempt():
    status, run_at = _after(budget_attempts=3, retry_backoff="exponential")
    assert status is S.PENDING
    assert dt.timedelta(seconds=7.2) <= run_at - NOW <= dt.timedelta(seconds=8.8)


def test_after_failure_with_retries_used_up_is_failed():
    assert _after(budget_attempts=4) == (S.FAILED, None)
    assert _after(budget_attempts=1, retry_limit=0) == (S.FAILED, None)


def test_after_failure_outside_retry_on_is_failed():
    assert _after(retryable=False) == (S.FAILED, None)


def test_after_failure_past_the_deadline_is_timeout():
    assert _after(deadline_at=NOW) == (S.TIMEOUT, None)
    assert _after(deadline_at=NOW - dt.timedelta(seconds=1), retryable=False) == (S.TIMEOUT, None)
    assert _after(deadline_at=NOW + dt.timedelta(microseconds=1))[0] is S.PENDING


def test_after_failure_requested_cancel_wins():
    assert _after(cancel_requested=True) == (S.CANCELLED, None)
    assert _after(cancel_requested=True, deadline_at=NOW, budget_attempts=9) == (S.CANCELLED, None)
