"""``manage.py executor``: status, show, retry, cancel and purge on every storage, through
call_command and as a real subprocess (exit codes end to end)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import logging
import time

import pytest
from django.core.management import CommandError, call_command

from django_reliable_executor import TaskStatus, TaskSubmitRequest, signals
from django_reliable_executor.core.clock import FakeClock, system_clock
from django_reliable_executor.core.progress import make_progress
from django_reliable_executor.core.records import TaskInfo
from django_reliable_executor.management.output import format_age, parse_duration
from django_reliable_executor.master.lock import MASTER_LOCK_NAME
from django_reliable_executor.registry import key_limits, rate_limits
from django_reliable_executor.service.reliable_executor import ReliableExecutor
from tests.support.commands import Result, Terminal, manage, process_env, run
from tests.support.contract_support import (
    claim_and_start,
    claim_one,
    recording,
    run_claim,
    run_next,
)
from tests.support.processes import Backend

TEN_DAYS = 10 * 86400


def words(line: str) -> str:
    return " ".join(line.split())


@pytest.fixture
def past_ex(live, make_storage) -> ReliableExecutor:
    """A service over the same tasks whose clock stands ten days back: what it stores was
    created, and finished, ten days ago."""
    clock = FakeClock(system_clock.now() - dt.timedelta(seconds=TEN_DAYS))
    return ReliableExecutor(make_storage(clock), clock=clock)


def completed(ex: ReliableExecutor, task_id: str, queue: str = "default") -> TaskInfo:
    ex.submit("demo.echo", {"id": task_id}, task_id=task_id, queue=queue)
    assert run_claim(ex, claim_one(ex.storage, queue=queue)) is TaskStatus.COMPLETED
    return ex.get_task(task_id)


def failed(ex: ReliableExecutor, task_id: str) -> TaskInfo:
    ex.submit("demo.always_fails", None, task_id=task_id, retry_limit=0)
    assert run_next(ex) is TaskStatus.FAILED
    return ex.get_task(task_id)


def running(ex: ReliableExecutor, task_id: str) -> TaskInfo:
    ex.submit("demo.echo", None, task_id=task_id)
    claim_and_start(ex.storage)
    return ex.get_task(task_id)


def cancelled(ex: ReliableExecutor, task_id: str, queue: str = "default") -> TaskInfo:
    ex.submit("demo.echo", None, task_id=task_id, queue=queue)
    assert ex.cancel_task(task_id)
    return ex.get_task(task_id)


@pytest.fixture
def scenario(now_ex, past_ex) -> dict[str, TaskInfo]:
    """Tasks in six statuses over two queues, one worker holding the master lock.

    default: done COMPLETED, f1 FAILED, r1 RUNNING, c1 CREATED (due ten days ago)
    mail:    p1 PENDING (due in an hour), x1 CANCELLED
    """
    tasks = {"done": completed(now_ex, "done"), "f1": failed(now_ex, "f1")}
    tasks["r1"] = running(now_ex, "r1")
    now_ex.submit("demo.always_fails", None, task_id="p1", queue="mail", retry_interval=3600000)
    claim = claim_one(now_ex.storage, queue="mail")
    assert run_claim(now_ex, claim) is TaskStatus.PENDING
    tasks["p1"] = now_ex.get_task("p1")
    tasks["x1"] = cancelled(now_ex, "x1", queue="mail")
    tasks["c1"] = past_ex.submit("demo.echo", {"waiting": True}, task_id="c1")
    storage = now_ex.storage
    storage.worker_seen("w-1", {"hostname": "web1", "pid": 4242, "queues": ["default", "mail"]})
    assert storage.acquire_lock(MASTER_LOCK_NAME, "w-1", 60)
    return tasks


# -- status -----------------------------------------------------------------------------------
ALL_ZERO = {status.value: 0 for status in TaskStatus}


def test_status_json_counts_master_workers_and_oldest_due(scenario, live, alias, key_prefix):
    result = run("status", "--json")
    assert (result.code, result.err) == (0, "")
    report = json.loads(result.out)
    assert list(report) == [
        "checked_at",
        "storage",
        "counts",
        "total",
        "queues",
        "paused_queues",
        "oldest_due_at",
        "oldest_due_age_seconds",
        "schedules",
        "rate_limits",
        "concurrency_keys",
        "master",
        "workers",
    ]
    default = {**ALL_ZERO, "CREATED": 1, "RUNNING": 1, "COMPLETED": 1, "FAILED": 1}
    mail = {**ALL_ZERO, "PENDING": 1, "CANCELLED": 1}
    assert report["queues"] == {"default": default, "mail": mail}
    assert list(report["queues"]["default"]) == [s.value for s in TaskStatus]
    assert report["counts"] == {k: default[k] + mail[k] for k in ALL_ZERO}
    assert report["total"] == 6
    assert report["oldest_due_at"] == scenario["c1"].run_at.isoformat()
    assert TEN_DAYS <= report["oldest_due_age_seconds"] < TEN_DAYS + 60
    assert report["master"] == "w-1"
    [worker] = report["workers"]
    seen = worker.pop("last_seen_seconds_ago")
    assert 0 <= seen < 60
    assert dt.datetime.fromisoformat(worker.pop("last_seen_at")).tzinfo is not None
    assert dt.datetime.fromisoformat(worker.pop("started_at")).tzinfo is not None
    assert worker == {
        "worker_id": "w-1",
        "hostname": "web1",
        "pid": 4242,
        "queues": ["default", "mail"],
    }
    if alias == "redis":
        assert report["storage"] == {"backend": "redis", "key_prefix": key_prefix}
    else:
        assert report["storage"] == {"backend": "database", "database_alias": alias}


def test_status_text_table(scenario, live):
    result = run("status")
    assert (result.code, result.err) == (0, "")
    lines = [words(line) for line in result.lines]
    header = "queue CREATED RUNNING PENDING COMPLETED FAILED TIMEOUT CANCELLED ERROR total"
    start = lines.index(header)
    assert lines[start + 1 : start + 4] == [
        "default 1 1 0 1 1 0 0 0 4",
        "mail 0 0 1 0 0 0 1 0 2",
        "(all) 1 1 1 1 1 0 1 0 6",
    ]
    assert lines[0].startswith("Storage: ")
    oldest = next(line for line in lines if line.startswith("Oldest due task:"))
    assert oldest.startswith("Oldest due task: waiting 10d 00h (due since ")
    assert "Master: w-1" in lines
    assert "Workers (1):" in lines
    worker = lines[lines.index("Workers (1):") + 2]
    assert worker.startswith("w-1 web1 4242 default,mail ")
    assert worker.endswith(" ago")


def test_status_shows_the_use_of_each_rate_limit(live):
    """demo.rated has rate_limit="5/s": three claimed starts show in its row."""
    for key in ("a", "a", "b"):
        live.submit("demo.rated", {}, rate_key=key)
    claims = live.storage.claim("w-1", ["default"], 10, 60, rate_limits=rate_limits(), start=10)
    assert sum(c.task.task_name == "demo.rated" for c in claims) == 3
    report = json.loads(run("status", "--json").out)
    rated = [use for use in report["rate_limits"] if use["task_name"] == "demo.rated"]
    assert rated == [
        {
            "task_name": "demo.rated",
            "limit": "5/s",
            "started": 3,
            "busiest_key": 2,
            "keys": 2,
            "held_back": 0,
        }
    ]
    # Every registered rate-limited name has its row (the demo's bench names with no use).
    names = {use["task_name"] for use in report["rate_limits"]}
    assert names == set(rate_limits())
    lines = [words(line) for line in run("status").lines]
    start = lines.index(f"Rate limits ({len(names)}):")
    assert "demo.rated 5/s 3 2/5 2 0" in lines[start + 2 : start + 2 + len(names)]


def test_status_shows_the_busiest_concurrency_keys(live):
    """demo.keyed has max_concurrency_per_key=2: its held tasks by key show in its row."""
    for key in ("acme", "acme", "acme", "globex"):
        live.submit("demo.keyed", {}, concurrency_key=key)
    claims = live.storage.claim("w-1", ["default"], 10, 60, key_limits=key_limits())
    assert sum(c.task.task_name == "demo.keyed" for c in claims) == 3
    report = json.loads(run("status", "--json").out)
    keyed = [use for use in report["concurrency_keys"] if use["task_name"] == "demo.keyed"]
    assert keyed == [
        {
            "task_name": "demo.keyed",
            "max_concurrency_per_key": 2,
            "held": 3,
            "keys": 2,
            "busiest": [{"key": "acme", "held": 2}, {"key": "globex", "held": 1}],
        }
    ]
    names = {use["task_name"] for use in report["concurrency_keys"]}
    assert names == set(key_limits())  # every name with a per-key cap has its row
    lines = [words(line) for line in run("status").lines]
    start = lines.index(f"Concurrency keys ({len(names)}):")
    assert "demo.keyed 2 3 2 acme 2/2, globex 1/2" in lines[start + 2 : start + 2 + len(names)]


def test_status_of_an_empty_store(live):
    text = run("status")
    assert text.code == 0
    lines = text.lines
    for expected in (
        "No tasks.",
        "Oldest due task: none waiting",
        "Schedules: none",
        "Master: none",
        "Workers: none",
    ):
        assert expected in lines
    report = json.loads(run("status", "--json").out)
    assert (report["counts"], report["total"], report["queues"]) == (ALL_ZERO, 0, {})
    assert report["schedules"] == {"active": 0, "paused": 0, "next_run_at": None}
    assert (report["oldest_due_at"], report["oldest_due_age_seconds"]) == (None, None)
    assert (report["master"], report["workers"]) == (None, [])


def test_status_counts_schedules_and_the_next_run(live):
    first = live.schedule("every-hour", "demo.echo", every=3600)
    live.schedule("daily", "demo.echo", cron="0 3 * * *")
    live.schedule("stopped", "demo.echo", every=60)
    live.pause_schedule("stopped")
    report = json.loads(run("status", "--json").out)
    assert report["schedules"] == {
        "active": 2,
        "paused": 1,
        "next_run_at": min(first.next_run_at, live.get_schedule("daily").next_run_at).isoformat(),
    }
    line = next(line for line in run("status").lines if line.startswith("Schedules:"))
    assert line.startswith("Schedules: 2 active, 1 paused; next run in ")


# -- show -------------------------------------------------------------------------------------
def test_show_prints_every_field_and_the_error_in_full(scenario, live):
    info = scenario["f1"]
    result = run("show", "f1")
    assert (result.code, result.err) == (0, "")
    fields = {}
    for line in result.lines:
        if not line or line.startswith(" ") or line.endswith(":"):
            continue
        name, _, value = line.partition("  ")
        fields[name] = value.strip()
    for field in dataclasses.fields(TaskInfo):
        # (debounced is a submit's answer only: a stored task never has it)
        if field.name not in ("parameter", "result", "last_error", "debounced"):
            assert field.name in fields, field.name
    assert fields["status"] == "FAILED"
    assert fields["attempts"] == "1"
    assert fields["finished_at"].startswith(info.finished_at.isoformat())
    # the traceback, every line of it, indented under "last_error:"
    block = result.out.split("\nlast_error:\n", 1)[1]
    assert [line[2:] for line in block.splitlines()] == info.last_error.rstrip("\n").splitlines()
    assert "RuntimeError: this task always fails" in block


def test_show_parameter_and_result_as_pretty_json(scenario, live):
    result = run("show", "done")
    assert result.code == 0
    assert '\nparameter:\n  {\n    "id": "done"\n  }\n' in result.out
    assert '\nresult:\n  {\n    "id": "done"\n  }\n' in result.out
    assert "\nlast_error:\n  (none)" in result.out


def test_show_json_is_every_taskinfo_field(scenario, live):
    info = scenario["c1"]
    result = run("show", "c1", "--json")
    assert (result.code, result.err) == (0, "")
    data = json.loads(result.out)
    assert list(data) == [field.name for field in dataclasses.fields(TaskInfo)]
    assert data["status"] == "CREATED"
    assert data["parameter"] == {"waiting": True}
    assert data["created_at"] == info.created_at.isoformat()
    assert (data["started_at"], data["finished_at"], data["result"]) == (None, None, None)
    assert data["cancel_requested"] is False


def test_show_prints_the_progress_as_text_and_json(live, now_ex):
    now_ex.submit("demo.echo", None, task_id="p1")
    claim = claim_and_start(now_ex.storage)
    reported = make_progress(3, 10, "copying", now_ex.clock.now())
    assert now_ex.storage.record_progress([(claim, reported)]) == 1
    line = next(line for line in run("show", "p1").lines if line.startswith("progress"))
    assert words(line).startswith(
        f"progress 3 of 10 (30%): copying, at {reported['updated_at'].isoformat()} ("
    )
    data = json.loads(run("show", "p1", "--json").out)
    assert data["progress"] == {
        "current": 3,
        "total": 10,
        "message": "copying",
        "updated_at": reported["updated_at"].isoformat(),
    }
    now_ex.submit("demo.echo", None, task_id="p2")
    assert words(next(x for x in run("show", "p2").lines if x.startswith("progress"))) == (
        "progress -"
    )
    assert json.loads(run("show", "p2", "--json").out)["progress"] is None


@pytest.mark.parametrize("json_flag", [(), ("--json",)], ids=["text", "json"])
def test_show_unknown_id_exits_1_with_a_message(live, json_flag):
    result = run("show", "nope", *json_flag)
    assert (result.code, result.out) == (1, "")
    assert "task 'nope' not found" in result.err
    assert "Traceback" not in result.err


# -- retry and cancel -------------------------------------------------------------------------
def test_retry_mix_reports_each_id_and_exits_1(scenario, live, caplog):
    caplog.set_level(logging.INFO, logger="django_reliable_executor")
    result = run("retry", "f1", "done", "c1", "nope", "x1", "f1")
    assert result.code == 1
    assert result.lines == [
        "f1: retried",
        "done: skipped: COMPLETED cannot be retried",
        "c1: skipped: CREATED cannot be retried",
        "nope: not found",
        "x1: retried",
        "2 changed, 2 skipped, 1 not found",
    ]
    assert "not every task changed (2 changed, 2 skipped, 1 not found)" in result.err
    for task_id, previous in (("f1", "FAILED"), ("x1", "CANCELLED")):
        info = live.get_task(task_id)
        assert (info.status, info.run_at <= system_clock.now()) == (TaskStatus.PENDING, True)
        # through the service: it logs the transition of a manual retry
        messages = [record.getMessage() for record in caplog.records]
        assert any(f"task {task_id} " in m and f"{previous} -> PENDING" in m for m in messages)
    assert live.get_task("done").status is TaskStatus.COMPLETED


def test_retry_exits_0_when_every_task_changed(scenario, live):
    result = run("retry", "f1", "x1")
    assert (result.code, result.err) == (0, "")
    assert result.lines == ["f1: retried", "x1: retried", "2 changed, 0 skipped, 0 not found"]


def test_retry_failed_re_drives_every_dead_letter(scenario, now_ex, live):
    for task_id, queue in (("f2", "dead"), ("m-f", "mail-dead")):
        now_ex.submit("demo.always_fails", None, task_id=task_id, queue=queue, retry_limit=0)
        claim = claim_one(now_ex.storage, queue=queue)
        assert run_claim(now_ex, claim) is TaskStatus.FAILED
    narrowed = run("retry", "--failed", "--queue", "mail-dead")
    assert (narrowed.code, narrowed.lines) == (
        0,
        ["m-f: retried", "1 changed, 0 skipped, 0 not found"],
    )
    result = run("retry", "--failed")
    assert result.code == 0
    assert sorted(result.lines[:-1]) == ["f1: retried", "f2: retried"]
    assert result.lines[-1] == "2 changed, 0 skipped, 0 not found"
    assert {live.get_task(i).status for i in ("f1", "f2", "m-f")} == {TaskStatus.PENDING}
    assert live.get_task("x1").status is TaskStatus.CANCELLED  # not a dead letter
    assert run("retry", "--failed").lines == ["0 changed, 0 skipped, 0 not found"]


@pytest.mark.parametrize(
    "args", [("retry",), ("retry", "f1", "--failed"), ("retry", "f1", "--queue", "mail")]
)
def test_retry_needs_ids_or_failed(live, args):
    result = run(*args)
    assert result.code == 2
    assert "--failed" in result.err


def test_cancel_mix_fires_signals_and_exits_1(scenario, live):
    with recording(signals.task_cancelled) as cancelled_signal:
        result = run("cancel", "c1", "r1", "done", "nope")
    assert result.code == 1
    assert result.lines == [
        "c1: cancelled",
        "r1: cancel requested (running)",
        "done: skipped: COMPLETED cannot be cancelled",
        "nope: not found",
        "2 changed, 1 skipped, 1 not found",
    ]
    # A waiting task is cancelled at once (signal); a running one only gets the flag.
    assert [call["task_id"] for call in cancelled_signal.calls] == ["c1"]
    assert live.get_task("c1").status is TaskStatus.CANCELLED
    r1 = live.get_task("r1")
    assert (r1.status, r1.cancel_requested) == (TaskStatus.RUNNING, True)


def test_cancel_exits_0_when_every_task_changed_and_ids_count_once(scenario, live):
    result = run("cancel", "p1", "c1", "p1")
    assert (result.code, result.err) == (0, "")
    assert result.lines == ["p1: cancelled", "c1: cancelled", "2 changed, 0 skipped, 0 not found"]


def test_cancel_of_unknown_ids_only(live):
    result = run("cancel", "a", "b")
    assert result.code == 1
    assert result.lines == ["a: not found", "b: not found", "0 changed, 0 skipped, 2 not found"]


# -- purge ------------------------------------------------------------------------------------
@pytest.fixture
def aged(now_ex, past_ex) -> None:
    """Finished ten days ago: old-done, old-failed, old-cancelled; still live from ten days
    ago: old-running, old-waiting; finished now: new-done."""
    completed(past_ex, "old-done")
    failed(past_ex, "old-failed")
    cancelled(past_ex, "old-cancelled")
    running(past_ex, "old-running")
    past_ex.submit("demo.echo", None, task_id="old-waiting")
    completed(now_ex, "new-done", queue="other")


def remaining(ex: ReliableExecutor) -> set[str]:
    return {info.task_id for info in ex.list_tasks(limit=1000)}


def purged_before(result: Result, deleted: int, seconds_ago: float) -> None:
    """The final line: "purged N tasks finished before <iso>", the cutoff now - seconds_ago."""
    assert result.lines[-1].startswith(f"purged {deleted} tasks finished before ")
    cutoff = dt.datetime.fromisoformat(result.lines[-1].rsplit(" ", 1)[1])
    expected = system_clock.now() - dt.timedelta(seconds=seconds_ago)
    assert abs((cutoff - expected).total_seconds()) < 60


def test_purge_by_status_and_age_never_touches_live_tasks(aged, live):
    everything = {"old-done", "old-failed", "old-cancelled", "old-running", "old-waiting"}
    result = run("purge", "--older-than", "7d", "--status", "failed", "--yes")
    assert (result.code, result.err) == (0, "")  # stderr is no terminal: no progress line
    purged_before(result, 1, 7 * 86400)
    assert remaining(live) == everything - {"old-failed"} | {"new-done"}

    result = run("purge", "--older-than", "11d", "--yes")
    assert result.code == 0
    purged_before(result, 0, 11 * 86400)

    terminal = Terminal()
    result = run(
        "purge",
        "--older-than",
        "1w",
        "--yes",
        "--batch-size",
        "1",
        "--pause",
        "0.01",
        stderr=terminal,
    )
    assert result.code == 0
    purged_before(result, 2, 7 * 86400)
    # one progress report per batch of 1, then the empty last batch, then a newline
    progress = [part.split(" in ")[0] for part in terminal.getvalue().split("\r\x1b[K")[1:]]
    assert progress == ["purging: 1 deleted", "purging: 2 deleted", "purging: 2 deleted"]
    assert terminal.getvalue().endswith("\n")
    assert remaining(live) == {"old-running", "old-waiting", "new-done"}

    result = run("purge", "--older-than", "0s", "--status", "COMPLETED", "ERROR", "--yes")
    purged_before(result, 1, 0)
    # live tasks stay, however old
    assert remaining(live) == {"old-running", "old-waiting"}


def test_purge_of_every_status_drops_the_batches_finished_as_long_ago(now_ex, past_ex, live):
    for ex, batch_id in ((past_ex, "old-batch"), (now_ex, "new-batch")):
        ex.submit_batch([TaskSubmitRequest("demo.echo", task_id=batch_id + "-0")], batch_id)
        ex.cancel_task(batch_id + "-0")  # its only member ended: the batch is finished
    result = run("purge", "--older-than", "7d", "--status", "CANCELLED", "--yes")
    assert len(result.lines) == 1  # no batch line: batches are purged with every status only
    purged_before(result, 1, 7 * 86400)
    assert live.get_batch("old-batch") is not None  # kept with --status
    result = run("purge", "--older-than", "7d", "--yes")
    assert result.lines[0].startswith("purged 1 batches finished before ")
    purged_before(result, 0, 7 * 86400)
    assert (live.get_batch("old-batch"), live.get_batch("new-batch").finished) == (None, True)


def test_purge_asks_on_a_terminal(aged, live):
    result = run("purge", "--older-than", "7d", stdin=Terminal("n\n"))
    assert (result.code, result.out) == (1, "")
    assert "Delete COMPLETED, FAILED, TIMEOUT, CANCELLED, ERROR tasks finished before" in result.err
    assert "purge not confirmed: nothing deleted" in result.err
    assert "old-done" in remaining(live)

    result = run("purge", "--older-than", "7d", "--status", "COMPLETED", stdin=Terminal("y\n"))
    assert result.code == 0
    purged_before(result, 1, 7 * 86400)
    assert "old-done" not in remaining(live)


def test_purge_without_yes_and_without_a_terminal_is_refused(aged, live):
    result = run("purge", "--older-than", "7d", stdin=io.StringIO("y\n"))
    assert (result.code, result.out) == (2, "")
    assert "pass --yes" in result.err
    assert "old-done" in remaining(live)


# -- usage errors (found by the parser, before the store is touched) --------------------------
@pytest.mark.parametrize("value", ["7x", "7", "d", "-1d", "1.5h", "", "7 days", "40000d"])
def test_purge_bad_duration_is_a_usage_error_naming_it(value):
    with pytest.raises(CommandError, match=f"invalid duration '{value}'"):
        call_command("executor", "purge", f"--older-than={value}", "--yes")


@pytest.mark.parametrize("status", ["CREATED", "PENDING", "RUNNING", "running"])
def test_purge_of_a_live_status_is_a_usage_error_naming_it(status):
    with pytest.raises(CommandError, match=f"{status.upper()} is not a finished status"):
        call_command("executor", "purge", "--older-than", "7d", "--status", status, "--yes")


def test_purge_unknown_status_and_bad_batch_size():
    with pytest.raises(CommandError, match="unknown status 'DONE'"):
        call_command("executor", "purge", "--older-than", "7d", "--status", "DONE", "--yes")
    with pytest.raises(CommandError, match="invalid batch size '0'"):
        call_command("executor", "purge", "--older-than", "7d", "--batch-size", "0", "--yes")
    for pause in ("-1", "x", "nan", "3601"):
        with pytest.raises(CommandError, match=f"invalid --pause '{pause}'"):
            call_command("executor", "purge", "--older-than", "7d", "--pause", pause, "--yes")


def test_missing_or_unknown_action_and_missing_ids():
    for args, message in (
        ((), "required: ACTION"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("cancel",), "required: task_id"),
        (("retry",), "give task ids or --failed"),
        (("purge", "--yes"), "required: --older-than"),
    ):
        with pytest.raises(CommandError, match=message):
            call_command("executor", *args)


@pytest.mark.parametrize(
    "text,seconds",
    [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("2w", 1209600)]
    + [("1d12h", 129600), (" 7D ", 604800), ("0s", 0)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == dt.timedelta(seconds=seconds)


def test_format_age():
    assert [format_age(s) for s in (-3, 4.25, 42, 307, 11100, 10 * 86400 + 3600 * 4)] == [
        "0.0s",
        "4.2s",
        "42s",
        "5m 07s",
        "3h 05m",
        "10d 04h",
    ]


def test_exit_codes_of_a_real_process(live, now_ex, alias, key_prefix):
    failed(now_ex, "f1")
    completed(now_ex, "done")
    env = process_env(Backend(alias, key_prefix))

    status = manage(env, "status", "--json")
    assert (status.returncode, status.stderr) == (0, "")
    report = json.loads(status.stdout)
    assert (report["counts"]["FAILED"], report["counts"]["COMPLETED"]) == (1, 1)

    retry = manage(env, "retry", "f1", "done", "nope")
    assert retry.returncode == 1, retry.stderr
    assert retry.stdout.splitlines() == [
        "f1: retried",
        "done: skipped: COMPLETED cannot be retried",
        "nope: not found",
        "1 changed, 1 skipped, 1 not found",
    ]
    assert retry.stderr.startswith("CommandError: not every task changed")

    show = manage(env, "show", "nope")
    assert (show.returncode, show.stdout) == (1, "")
    assert show.stderr == "CommandError: task 'nope' not found\n"
    assert live.get_task("f1").status is TaskStatus.PENDING


def test_usage_and_unavailable_exit_codes_of_a_real_process():
    """Nothing here reaches a store: argument errors stop before it, and this Redis is down."""
    env = process_env()
    for args, message in (
        (("purge", "--older-than", "7x"), "invalid duration '7x'"),
        (("purge", "--older-than", "7d", "--status", "RUNNING"), "RUNNING is not a finished"),
        ((), "the following arguments are required: ACTION"),
    ):
        usage = manage(env, *args)
        assert (usage.returncode, usage.stdout) == (2, ""), usage.stderr
        assert message in usage.stderr
        assert "usage: " in usage.stderr
    refused = manage(env, "purge", "--older-than", "7d")  # stdin is no terminal here
    assert refused.returncode == 2
    assert "pass --yes" in refused.stderr

    down = process_env(RE_STORAGE="redis", RE_REDIS_URL="redis://127.0.0.1:1/0")
    for args in (("status",), ("retry", "x")):  # each waits ~1 s for redis-py's retries
        unavailable = manage(down, *args)
        assert (unavailable.returncode, unavailable.stdout) == (3, "")
        assert unavailable.stderr.startswith("CommandError: task store unavailable: Redis at ")


def test_purge_interrupted_reports_what_was_deleted(aged, live, monkeypatch):
    real = live.purge_finished

    def interrupted(*args, **kwargs):
        progress = kwargs["progress"]

        def then_interrupt(deleted):
            progress(deleted)
            raise KeyboardInterrupt

        return real(*args, **{**kwargs, "progress": then_interrupt})

    monkeypatch.setattr(live, "purge_finished", interrupted)
    result = run("purge", "--older-than", "7d", "--yes", "--batch-size", "1")
    assert (result.code, result.out) == (130, "")
    assert "interrupted: purged 1 tasks finished before " in result.err
    assert len({"old-done", "old-failed", "old-cancelled"} & remaining(live)) == 2


def test_retry_of_a_timed_out_task_whose_handler_still_runs_says_where_it_runs(now_ex, live):
    now_ex.submit("demo.echo", None, task_id="late", max_duration_millis=1)
    claim_and_start(now_ex.storage, "w-late")
    time.sleep(0.01)  # past the 1 ms deadline
    assert [t.task.task_id for t in now_ex.storage.expire_overdue(10)] == ["late"]
    result = run("retry", "late")
    assert result.code == 1
    [line, summary] = result.lines
    assert line.startswith("late: skipped: its previous attempt is still running on worker w-late")
    assert summary == "0 changed, 1 skipped, 0 not found"
    assert live.get_task("late").status is TaskStatus.TIMEOUT
