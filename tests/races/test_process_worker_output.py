"""What runexecutor shows a project that has not configured logging (startproject's
settings): a line per task transition on stderr, -v 0 quiet, --loglevel, and the start
banner naming the handlers and the schedules declared in code."""

from __future__ import annotations

import pytest

from tests.conftest import db_params
from tests.support.processes import Backend, service_for

NEWCOMER = ("--settings", "testproject.settings_newcomer")
pytestmark = pytest.mark.parametrize("alias", db_params(["default"]))


def burst(workers, *args: str) -> tuple[str, str]:
    """Submit one task, run a burst worker with ``args``; (the task id, the worker's output)."""
    backend = Backend("default", "unused")
    task = service_for(backend).submit("demo.echo", "hello")
    worker = workers.start(backend, "--burst", *NEWCOMER, *args)
    assert worker.wait(60) == 0, worker.log()
    return task.task_id, worker.log()


def test_each_transition_is_a_line_and_the_banner_names_handlers_and_schedules(alias, workers):
    task_id, output = burst(workers)
    assert f"INFO task {task_id} (demo.echo) claimed -> RUNNING attempt=1" in output, output
    assert f"INFO task {task_id} (demo.echo) RUNNING -> COMPLETED attempt=1" in output, output
    assert "handlers (" in output and "  demo.echo  queue=default" in output, output
    assert "  demo.rated  queue=default rate_limit=5/s" in output, output
    keyed = "  demo.fair_keyed  queue=default max_concurrency=4 max_concurrency_per_key=2 "
    assert keyed + "fairness=round_robin\n" in output, output
    assert "schedules declared in code (" in output, output


@pytest.mark.parametrize("quiet", [("-v", "0"), ("--loglevel", "warning")])
def test_quiet_shows_no_transition_line(alias, workers, quiet):
    task_id, output = burst(workers, *quiet)
    assert task_id not in output, output
    if quiet[0] == "-v":
        assert "handlers (" not in output, output


def test_a_bad_loglevel_is_refused_naming_the_choices(alias, workers):
    backend = Backend("default", "unused")
    worker = workers.start(backend, "--burst", *NEWCOMER, "--loglevel", "loud", wait_ready=False)
    assert worker.wait(60) != 0
    assert "--loglevel" in worker.log() and "DEBUG" in worker.log(), worker.log()


def test_a_stop_signal_is_logged_as_it_arrives_saying_what_happens_next(alias, workers):
    backend = Backend("default", "unused")
    worker = workers.start(backend, *NEWCOMER, "--shutdown-timeout", "7")
    worker.terminate()
    assert worker.wait(60) == 0, worker.log()
    output = worker.log()
    assert "INFO SIGTERM received: stopping; no new claims" in output, output
    assert "up to 7s (--shutdown-timeout)" in output, output
