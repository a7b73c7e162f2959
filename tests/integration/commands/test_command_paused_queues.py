"""``manage.py executor pause-queue|resume-queue NAME`` and the paused queues in ``status``, on
every storage."""

from __future__ import annotations

import json

import pytest

from tests.support.commands import run


def test_pause_and_resume_a_queue_and_see_it_in_status(live):
    live.submit("demo.echo", None, queue="mail")
    result = run("pause-queue", "mail")
    assert (result.code, result.lines) == (0, ["paused queue mail"])
    assert live.paused_queues() == {"mail"}
    assert run("pause-queue", "mail").lines == ["queue mail was paused already"]
    assert "Paused queues: mail" in run("status").lines
    assert json.loads(run("status", "--json").out)["paused_queues"] == ["mail"]
    result = run("resume-queue", "mail")
    assert (result.code, result.lines) == (0, ["resumed queue mail"])
    assert live.paused_queues() == set()
    assert run("resume-queue", "mail").lines == ["queue mail was not paused"]
    assert "Paused queues: none" in run("status").lines
    assert json.loads(run("status", "--json").out)["paused_queues"] == []


@pytest.mark.parametrize("action", ["pause-queue", "resume-queue"])
def test_an_unknown_queue_exits_1_and_a_bad_name_exits_2(live, action):
    result = run(action, "mial")
    assert result.code == 1
    assert "unknown queue 'mial'" in result.err
    result = run(action, "a,b")
    assert result.code == 2
    assert "queue must be 1..100 characters without whitespace or commas" in result.err
    assert live.paused_queues() == set()
