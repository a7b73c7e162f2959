"""states: the statuses and the table of allowed transitions."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from django_reliable_executor.core.states import (
    FAILURE_STATUSES,
    RETRYABLE_BY_HAND,
    TERMINAL_STATUSES,
    TRANSITIONS,
    WAITING_STATUSES,
    can_transition,
)

S = TaskStatus


def test_terminal_and_waiting_statuses():
    assert {S.COMPLETED, S.FAILED, S.TIMEOUT, S.CANCELLED, S.ERROR} == TERMINAL_STATUSES
    assert {S.CREATED, S.PENDING} == WAITING_STATUSES
    assert TERMINAL_STATUSES - {S.COMPLETED} == RETRYABLE_BY_HAND
    assert {S.FAILED, S.TIMEOUT, S.ERROR} == FAILURE_STATUSES
    assert [s for s in S if s.is_terminal] == [s for s in S if s in TERMINAL_STATUSES]
    assert set(TRANSITIONS) == set(S)


ALLOWED = {
    (S.CREATED, S.RUNNING),
    (S.CREATED, S.CANCELLED),
    (S.CREATED, S.TIMEOUT),
    (S.PENDING, S.RUNNING),
    (S.PENDING, S.CANCELLED),
    (S.PENDING, S.TIMEOUT),
    (S.RUNNING, S.COMPLETED),
    (S.RUNNING, S.PENDING),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.TIMEOUT),
    (S.RUNNING, S.CANCELLED),
    (S.RUNNING, S.ERROR),
    (S.FAILED, S.PENDING),
    (S.TIMEOUT, S.PENDING),
    (S.CANCELLED, S.PENDING),
    (S.ERROR, S.PENDING),
}


@pytest.mark.parametrize("source", list(S))
def test_transition_table_is_exactly_the_design(source):
    for target in S:
        assert can_transition(source, target) == ((source, target) in ALLOWED), (source, target)


def test_completed_is_final_and_nothing_returns_to_created():
    assert TRANSITIONS[S.COMPLETED] == frozenset()
    assert not any(can_transition(source, S.CREATED) for source in S)


def test_status_is_a_plain_string():
    assert S.RUNNING == "RUNNING"
    assert str(S.RUNNING) == "RUNNING"
    assert S("PENDING") is S.PENDING
    assert len(S) == 8
