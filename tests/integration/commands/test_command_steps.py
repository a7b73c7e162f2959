"""``manage.py executor retry TASK_ID --from-step NAME`` on every storage: the line per task and
the exit codes of a plain retry; an unknown step skips the task unchanged, naming the step."""

from __future__ import annotations

import pytest

from django_reliable_executor import TaskStatus
from tests.support.admin_support import STEPS, fail_after_steps
from tests.support.commands import run

ALL = [name for name, _ in STEPS]


def step_names(ex, task_id):
    return [step.name for step in ex.get_task(task_id).steps]


@pytest.fixture
def stepped(now_ex, live):
    """Tasks "s1" and "s2", each FAILED after storing the STEPS' checkpoints."""
    for task_id in ("s1", "s2"):
        fail_after_steps(now_ex, task_id)
    return live


def test_retry_from_a_step_discards_it_and_the_later_ones_and_exits_0(stepped):
    result = run("retry", "s1", "--from-step", "invoice")
    assert (result.code, result.err) == (0, "")
    assert result.lines == ["s1: retried from step 'invoice'", "1 changed, 0 skipped, 0 not found"]
    assert stepped.get_task("s1").status is TaskStatus.PENDING
    assert step_names(stepped, "s1") == ["charge"]
    assert step_names(stepped, "s2") == ALL


def test_retry_from_a_step_reports_each_id_and_exits_1_when_any_was_skipped(stepped, now_ex):
    now_ex.submit("contract.hook", None, task_id="plain", queue="elsewhere", delay_millis=60_000)
    assert stepped.retry_task("s2", from_step="email")
    result = run("retry", "s1", "s2", "plain", "nope", "--from-step", "email")
    assert result.code == 1
    assert result.lines == [
        "s1: retried from step 'email'",
        "s2: skipped: PENDING cannot be retried",
        "plain: skipped: CREATED cannot be retried",
        "nope: not found",
        "1 changed, 2 skipped, 1 not found",
    ]
    assert "not every task changed (1 changed, 2 skipped, 1 not found)" in result.err
    assert step_names(stepped, "s1") == ["charge", "invoice"]


def test_retry_from_a_step_the_task_has_no_checkpoint_of_skips_it_unchanged(stepped):
    result = run("retry", "s1", "--from-step", "nope")
    assert result.code == 1
    assert result.lines[0] == (
        "s1: skipped: task s1 has no checkpoint of step 'nope' (stored steps, in the order "
        "they finished: 'charge', 'invoice', 'email'); nothing was changed"
    )
    assert result.lines[1] == "0 changed, 1 skipped, 0 not found"
    assert stepped.get_task("s1").status is TaskStatus.FAILED
    assert step_names(stepped, "s1") == ALL


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("retry", "--failed", "--from-step", "charge"), "--from-step takes task ids"),
        (("retry", "s1", "--from-step", ""), "--from-step must be a non-empty string"),
        (("retry", "s1", "--from-step", "x" * 192), "--from-step must be at most 191"),
    ],
)
def test_a_from_step_that_cannot_apply_is_a_usage_error(stepped, args, words):
    result = run(*args)
    assert result.code == 2 and words in result.err
    assert stepped.get_task("s1").status is TaskStatus.FAILED
    assert step_names(stepped, "s1") == ALL
