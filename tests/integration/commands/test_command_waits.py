"""``manage.py executor send-event TASK_ID NAME [--payload JSON]`` and ``show`` of a waiting task,
on every storage: the line printed and the exit codes (1: not found or ended, 2: a payload or
name that cannot be one)."""

from __future__ import annotations

from django_reliable_executor import TaskStatus
from tests.support.admin_support import run_one, wait_for_event
from tests.support.commands import run


def test_send_event_resumes_the_waiting_task_and_exits_0(live, now_ex):
    wait_for_event(now_ex, "w1")
    result = run("send-event", "w1", "approved", "--payload", '{"by": "ann"}')
    assert (result.code, result.err) == (0, "")
    assert result.lines == ["w1: event 'approved' sent"]
    assert live.storage.task_events("w1") == {"approved": {"by": "ann"}}
    assert run_one(now_ex, "waits") is TaskStatus.COMPLETED
    assert live.get_task("w1").result == {"payload": {"by": "ann"}}


def test_show_says_what_a_waiting_task_waits_for(live, now_ex):
    wait_for_event(now_ex, "w2")
    result = run("show", "w2")
    assert result.code == 0
    fields = dict(line.split(None, 1) for line in result.lines if len(line.split(None, 1)) == 2)
    assert fields["resumptions"] == "1"
    assert fields["waiting"] == "event 'approved'"
    assert fields["steps"] == "charge, approved"


def test_send_event_to_an_unknown_or_ended_task_exits_1(live, now_ex):
    result = run("send-event", "nobody", "go")
    assert result.code == 1 and "task 'nobody' not found" in result.err
    now_ex.submit("contract.hook", None, task_id="over", queue="waits")
    assert run_one(now_ex, "waits") is TaskStatus.COMPLETED
    result = run("send-event", "over", "go")
    assert result.code == 1 and "task 'over' has ended: event 'go' not sent" in result.err


def test_a_bad_payload_or_name_exits_2_and_stores_nothing(live, now_ex):
    wait_for_event(now_ex, "w3")
    result = run("send-event", "w3", "approved", "--payload", "{nope")
    assert result.code == 2 and "--payload is not JSON" in result.err
    result = run("send-event", "w3", "x" * 300)
    assert result.code == 2 and "at most" in result.err
    assert live.storage.task_events("w3") == {}
