"""django_reliable_executor.testing: run_tasks() inside django.test.TestCase (the test's open
transaction, never committed) on SQLite, MariaDB, PostgreSQL and Redis; the TestCase mixin and
the pytest fixture; runexecutor refused inside a transaction."""

from __future__ import annotations

import warnings

from demo.models import Execution
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import TestCase, TransactionTestCase, override_settings

from django_reliable_executor import TaskStatus, TaskSubmitRequest, executor, signals
from django_reliable_executor.registry import get_handler, name_limits, rate_limits
from django_reliable_executor.testing import (
    TasksHeldBackWarning,
    TaskTestMixin,
    reliable_tasks,
    run_tasks,
    without_flow_limits,
)
from tests.conftest import REDIS_URL, require
from tests.support.contract_support import recording

__all__ = ["reliable_tasks"]  # the pytest fixture, used below by name


class RunTasksCases(TaskTestMixin):
    """The cases, run by one TestCase per storage below."""

    alias = "default"  # the test database of the task storage (Redis: of the demo's rows)

    def setUp(self) -> None:
        require("redis" if executor.settings.STORAGE == "redis" else self.alias)
        super().setUp()

    def test_a_task_submitted_in_the_test_runs_in_its_transaction(self) -> None:
        task = executor.submit("demo.record", {})
        with recording(signals.task_completed) as completed:
            ran = self.run_tasks()
        assert [(info.task_id, info.status, info.attempts) for info in ran] == [
            (task.task_id, TaskStatus.COMPLETED, 1)
        ]
        # The handler's own ORM write, in the test's transaction, and the signal.
        assert Execution.objects.using(self.alias).filter(task_id=task.task_id).count() == 1
        assert [call["task_id"] for call in completed.calls] == [task.task_id]
        assert self.run_tasks() == []  # nothing left to run

    def test_a_chain_runs_in_order_and_until_idle_false_runs_only_what_is_due(self) -> None:
        steps = executor.chain(
            [TaskSubmitRequest("demo.echo", i, task_id=f"step-{i}") for i in range(3)]
        )
        first = self.run_tasks(until_idle=False)
        assert [(info.task_id, info.status) for info in first] == [("step-0", TaskStatus.COMPLETED)]
        rest = self.run_tasks()
        assert [(info.task_id, info.result) for info in rest] == [("step-1", 1), ("step-2", 2)]
        assert [executor.get_task(s.task_id).status for s in steps] == [TaskStatus.COMPLETED] * 3

    def test_a_retry_that_falls_due_runs_and_a_failure_is_recorded(self) -> None:
        flaky = executor.submit("demo.flaky", {"fail_times": 1}, retry_interval=0)
        failing = executor.submit("demo.always_fails", None, retry_limit=0)
        ran = {info.task_id: info for info in self.run_tasks()}
        assert (ran[flaky.task_id].status, ran[flaky.task_id].attempts) == (
            TaskStatus.COMPLETED,
            2,
        )
        assert ran[failing.task_id].status is TaskStatus.FAILED
        assert "always" in (ran[failing.task_id].last_error or "")

    def test_an_attempt_past_its_attempt_timeout_is_retried_as_in_a_worker(self) -> None:
        task = executor.submit(
            "demo.cooperative",
            {"sleep": 30, "sleep_attempts": 1},
            attempt_timeout=0.2,
            retry_interval=0,
        )
        [ran] = self.run_tasks()
        assert (ran.task_id, ran.status, ran.attempts) == (task.task_id, TaskStatus.COMPLETED, 2)
        assert (ran.last_error or "").startswith("attempt timed out after 0.2 s")

    def test_durable_steps_run_once_across_attempts(self) -> None:
        # On a database step "two" is atomic=True: its row of the failed attempt rolls back
        # (a savepoint of the test's transaction).
        atomic = executor.settings.STORAGE != "redis"
        task = executor.submit("demo.steps", {"fail": "two", "atomic": atomic}, retry_interval=0)
        (ran,) = self.run_tasks()
        assert (ran.status, ran.attempts) == (TaskStatus.COMPLETED, 2), ran.last_error
        assert ran.result == ["one@1", "two@2", "three@2"]
        assert [step.name for step in executor.get_task(task.task_id).steps] == [
            "one",
            "two",
            "three",
        ]
        if atomic:
            rows = Execution.objects.using(self.alias).filter(task_id=f"{task.task_id}:two")
            assert [row.attempt for row in rows] == [2]

    def test_a_task_waiting_for_an_event_runs_to_its_wait_then_on_once_it_is_sent(self) -> None:
        task = executor.submit("demo.waits", {"wait": "event"})
        (ran,) = self.run_tasks()
        assert ran.status is TaskStatus.PENDING and ran.waiting["event"] == "go"
        assert self.run_tasks() == []  # nothing due: it waits
        assert executor.send_event(task.task_id, "go", {"ok": 1})
        (ran,) = self.run_tasks()
        assert (ran.status, ran.attempts, ran.resumptions) == (TaskStatus.COMPLETED, 1, 1)
        assert ran.result == {"steps": ["before@0", "after@1"], "event": {"ok": 1}}

    def test_limit_and_queues_bound_what_runs(self) -> None:
        for i in range(3):
            executor.submit("demo.echo", i, queue="mail")
        other = executor.submit("demo.echo", "other", queue="default")
        assert len(self.run_tasks(queues=["mail"], limit=2)) == 2
        assert executor.get_task(other.task_id).status is TaskStatus.CREATED
        assert len(self.run_tasks(queues=["mail"])) == 1
        assert [info.task_id for info in self.run_tasks()] == [other.task_id]

    def test_a_batch_callback_runs_once_its_members_ended(self) -> None:
        batch = executor.submit_batch(
            [TaskSubmitRequest("demo.echo", i) for i in range(2)],
            on_complete=TaskSubmitRequest("demo.echo", "done", task_id="callback"),
        )
        ran = [info.task_id for info in self.run_tasks()]
        assert len(ran) == 3 and ran[-1] == "callback"
        assert executor.get_batch(batch.batch_id).finished

    def test_tasks_held_back_by_a_rate_limit_are_named_in_a_warning(self) -> None:
        """demo.rated: rate_limit="5/s". Five of eight run; the warning says why the other
        three did not, and a delayed task (not due) is not counted."""
        for _ in range(8):
            executor.submit("demo.rated", None)
        executor.submit("demo.rated", None, delay_millis=3_600_000)
        with self.assertWarns(TasksHeldBackWarning) as caught:
            ran = self.run_tasks()
        assert 1 <= len(ran) <= 5
        message = str(caught.warning)
        assert f'demo.rated: {8 - len(ran)} held back by rate_limit="5/s"' in message, message
        assert "testing docs" in message and caught.filename == __file__

    def test_without_flow_limits_every_task_runs_and_the_limits_come_back(self) -> None:
        """docs/testing.md's recipe: submits and run_tasks() inside without_flow_limits()."""
        hourly = get_handler("demo.noop_hourly")
        with without_flow_limits("demo.noop_hourly", "demo.capped"):
            assert get_handler("demo.noop_hourly").rate_limit is None
            assert "demo.noop_hourly" not in rate_limits() and "demo.capped" not in name_limits()
            for _ in range(3):
                executor.submit("demo.noop_hourly", None)
            with warnings.catch_warnings():
                warnings.simplefilter("error", TasksHeldBackWarning)
                assert len(self.run_tasks()) == 3
        assert get_handler("demo.noop_hourly") is hourly and hourly.rate_limit is not None
        assert rate_limits()["demo.noop_hourly"] == hourly.rate_limit
        assert name_limits()["demo.capped"] == 2
        with self.assertRaises(ValueError), without_flow_limits("no.such.task"):
            pass

    def test_tasks_held_back_by_a_cap_or_a_paused_queue_are_named(self) -> None:
        """demo.outlive_capped (max_concurrency=1) has a task running elsewhere: the next
        waits for it. A paused queue's due task waits for resume_queue()."""
        with self.captureOnCommitCallbacks(execute=True):  # stored now on Redis too
            executor.submit("demo.outlive_capped", {}, task_id="running")
        limits = {"name_limits": name_limits(), "rate_limits": rate_limits()}
        [claim] = executor.storage.claim("elsewhere", ["default"], 1, 60, **limits)
        assert executor.storage.start(claim, 60) is not None
        executor.submit("demo.outlive_capped", {}, task_id="capped")
        with self.captureOnCommitCallbacks(execute=True):  # a stored task makes "mail" known
            executor.submit("demo.echo", 1, queue="mail")
        executor.pause_queue("mail")
        with self.assertWarns(TasksHeldBackWarning) as caught:
            assert self.run_tasks() == []
        message = str(caught.warning)
        assert "demo.outlive_capped: 1 held back by max_concurrency=1" in message, message
        assert "queue 'mail': paused: resume_queue() lets it run" in message, message
        with self.assertWarns(TasksHeldBackWarning) as caught:
            self.run_tasks(queues=["mail"])
        assert "outlive_capped" not in str(caught.warning)

    def test_no_warning_when_every_due_task_ran_or_the_limit_ended_the_call(self) -> None:
        for i in range(3):
            executor.submit("demo.echo", i)
        executor.submit("demo.noop_rated", None, delay_millis=3_600_000)  # not due
        with warnings.catch_warnings():
            warnings.simplefilter("error", TasksHeldBackWarning)
            assert len(self.run_tasks(limit=1)) == 1
            executor.submit("demo.noop_rated", None)
            assert len(self.run_tasks()) == 3  # two echos and the rated one, within its limit

    def test_bad_arguments_are_refused(self) -> None:
        for bad in ({"limit": 0}, {"limit": "2"}, {"queues": "mail"}):
            with self.assertRaises(ValueError) as caught:
                run_tasks(**bad)
            assert next(iter(bad)) in str(caught.exception)

    def test_runexecutor_is_refused_at_once_inside_the_test_transaction(self) -> None:
        with self.assertRaises(CommandError) as caught:
            call_command("runexecutor", "--burst")
        assert "open transaction" in str(caught.exception)
        assert "run_tasks()" in str(caught.exception)


class RunTasksOnSQLite(RunTasksCases, TestCase):
    databases = {"default"}


@override_settings(RELIABLE_EXECUTOR={"DATABASE_ALIAS": "mariadb"})
class RunTasksOnMariaDB(RunTasksCases, TestCase):
    databases = {"default", "mariadb"}
    alias = "mariadb"


@override_settings(RELIABLE_EXECUTOR={"DATABASE_ALIAS": "postgres"})
class RunTasksOnPostgreSQL(RunTasksCases, TestCase):
    databases = {"default", "postgres"}
    alias = "postgres"


@override_settings(RELIABLE_EXECUTOR={"STORAGE": "redis", "REDIS_URL": REDIS_URL})
class RunTasksOnRedis(RunTasksCases, TestCase):
    """The submits of the test wait for its transaction to commit (never, in a TestCase):
    run_tasks stores them first. The mixin gives each test a key prefix of its own."""

    databases = {"default"}

    def test_each_test_has_keys_of_its_own(self) -> None:
        assert "-test-" in executor.settings.KEY_PREFIX
        assert executor.list_tasks() == []

    def test_a_submit_is_written_at_the_commit_that_capture_runs(self) -> None:
        """docs/testing.md's captureOnCommitCallbacks example."""
        with self.captureOnCommitCallbacks(execute=True), transaction.atomic():
            task = executor.submit("demo.echo", 42)
            assert executor.get_task(task.task_id) is None  # not written yet
        assert executor.get_task(task.task_id) is not None  # written at the commit
        assert [info.result for info in self.run_tasks()] == [42]


class RealWorkerInATransactionTestCase(TransactionTestCase):
    """docs/testing.md: a worker started with --burst from a TransactionTestCase."""

    databases = {"default"}

    def test_a_worker_runs_the_task(self) -> None:
        task = executor.submit("demo.echo", "by a worker")
        call_command("runexecutor", "--burst", "--shutdown-timeout", "5")
        assert executor.get_task(task.task_id).status == "COMPLETED"


def test_the_pytest_fixture_runs_the_tests_tasks(db, reliable_tasks) -> None:
    task = executor.submit("demo.echo", "from pytest")
    assert [(info.task_id, info.result) for info in reliable_tasks()] == [
        (task.task_id, "from pytest")
    ]
