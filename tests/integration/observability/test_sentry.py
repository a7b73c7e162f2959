"""Sentry, set up as a Django project does (DjangoIntegration), with its events kept in memory
(tests/support/sentry_child.py): every event sent during an attempt — the handler's own, and the
worker's ERROR line of a task that failed — carries the task's tags."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import require
from tests.support.processes import MANAGE, ROOT, Backend, _die_with_parent


def events_of(backend: Backend, submits: list[dict]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RE_")}
    env.update(
        backend.environment(),
        DJANGO_SETTINGS_MODULE="testproject.settings",
        PYTHONPATH=os.pathsep.join([str(MANAGE.parent), str(ROOT)]),
        RE_DEBUG="0",
    )
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.sentry_child", json.dumps(submits)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_die_with_parent,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_events_of_an_attempt_carry_the_task_id(alias, key_prefix):
    require(alias)
    events = events_of(
        Backend(alias, key_prefix),
        [
            {"task_name": "demo.reports", "task_id": "reports-ok"},
            {
                "task_name": "demo.reports",
                "parameter": {"fail": True},
                "task_id": "reports-fails",
                "retry_limit": 0,
            },
            {
                "task_name": "demo.async_traced",
                "parameter": {"fail_times": 5},
                "task_id": "async-fails",
                "retry_limit": 0,
            },
        ],
    )
    by_message = {}
    for event in events:
        text = event.get("message") or event.get("logentry", {}).get("formatted") or ""
        by_message.setdefault(text, []).append(event)
    reported = by_message["reported by the handler"]
    assert sorted(event["tags"]["task_id"] for event in reported) == [
        "reports-fails",
        "reports-ok",
    ]
    for event in reported:
        assert event["tags"]["task_name"] == "demo.reports"
        assert event["tags"]["queue"] == "default"
    # The worker's ERROR line of the failed task (Sentry's logging integration): tagged too.
    failed = [
        event
        for event in events
        if "RUNNING -> FAILED" in (event.get("logentry", {}).get("formatted") or "")
    ]
    by_task = {event["tags"]["task_id"]: event for event in failed}
    assert sorted(by_task) == ["async-fails", "reports-fails"]
    assert "ValueError: the handler failed" in by_task["reports-fails"]["logentry"]["formatted"]
    # ... with the handler's exception and its stack (Sentry groups it by that, not as one
    # message for every failed task), for an async handler too.
    for task_id, kind, function in (
        ("reports-fails", "ValueError", "reports"),
        ("async-fails", "ConnectionError", "async_traced"),
    ):
        (exception,) = by_task[task_id]["exception"]["values"]
        assert exception["type"] == kind
        frames = [frame["function"] for frame in exception["stacktrace"]["frames"]]
        assert frames[-1] == function, frames
