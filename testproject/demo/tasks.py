"""Handlers of the demo and the tests: a realistic mix of fast, failing, slow and flaky work."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import time

from asgiref.sync import sync_to_async

from django_reliable_executor import TaskContext, reliable_task_handler
from django_reliable_executor.conf import get_settings

from .models import Execution


@dataclasses.dataclass
class OrderParam:
    order_id: int
    amount: float
    currency: str = "EUR"


class PaymentDeclined(Exception):
    """Not worth retrying: excluded from retry_on."""


@reliable_task_handler(name="demo.noop")
def noop() -> None:
    """Does nothing (benchmarks)."""


@reliable_task_handler(name="demo.noop_rated", rate_limit="100000/s")
def noop_rated() -> None:
    """Does nothing, under a rate limit far above any drain rate (bench/rate_limits.py)."""


@reliable_task_handler(name="demo.noop_hourly", rate_limit="1/h")
def noop_hourly() -> None:
    """Does nothing, once an hour: a backlog of it stays held at its limit (bench)."""


@reliable_task_handler(name="demo.cpu")
def cpu(param: dict | None = None) -> int:
    """Pure-Python work holding the GIL throughout: ``iterations`` rounds of arithmetic
    (the default 200,000 take about 20 ms here). The CPU-bound benchmark's handler."""
    total = 0
    for i in range(int((param or {}).get("iterations", 200_000))):
        total += i * i % 7
    return total


@reliable_task_handler(name="demo.echo")
def echo(param):
    return param


@reliable_task_handler(
    name="demo.process_order",
    param_type=OrderParam,
    retry_on=(ConnectionError,),
    retry_interval=200,
)
def process_order(param: OrderParam) -> dict:
    if param.amount < 0:
        raise PaymentDeclined(f"order {param.order_id}: negative amount")
    time.sleep(0.05)
    return {"order_id": param.order_id, "charged": param.amount, "currency": param.currency}


@reliable_task_handler(name="demo.flaky", takes_context=True, retry_interval=100)
def flaky(param: dict, context: TaskContext) -> str:
    """Fails the first ``fail_times`` attempts, then succeeds."""
    if context.attempt <= param.get("fail_times", 1):
        raise ConnectionError(f"attempt {context.attempt}: upstream not reachable")
    return f"succeeded on attempt {context.attempt}"


def _inner_span(name: str) -> object:
    """A span of the handler's own (a child of the worker's run span), when tracing is on."""
    try:
        from opentelemetry import trace
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return trace.get_tracer("demo").start_as_current_span(name)


@reliable_task_handler(name="demo.traced", takes_context=True, retry_interval=50)
def traced(param: dict | None, context: TaskContext) -> int:
    """Opens a span of its own; fails (ConnectionError, retried) the first ``fail_times``
    attempts."""
    with _inner_span("demo inner"):
        if context.attempt <= (param or {}).get("fail_times", 0):
            raise ConnectionError(f"attempt {context.attempt}: upstream not reachable")
    return context.attempt


@reliable_task_handler(name="demo.async_traced", takes_context=True, retry_interval=50)
async def async_traced(param: dict | None, context: TaskContext) -> int:
    """demo.traced, async."""
    with _inner_span("demo inner"):
        await asyncio.sleep(0)
        if context.attempt <= (param or {}).get("fail_times", 0):
            raise ConnectionError(f"attempt {context.attempt}: upstream not reachable")
    return context.attempt


@reliable_task_handler(name="demo.reports")
def reports(param: dict | None = None) -> None:
    """Sends an event to Sentry of its own (when Sentry is set up), then fails if asked to."""
    import sys

    sentry = sys.modules.get("sentry_sdk")
    if sentry is not None:
        sentry.capture_message("reported by the handler")
    if (param or {}).get("fail"):
        raise ValueError("the handler failed")


@reliable_task_handler(name="demo.always_fails", retry_interval=100)
def always_fails(param=None) -> None:
    raise RuntimeError("this task always fails")


@reliable_task_handler(name="demo.slow", takes_context=True)
def slow(param: dict, context: TaskContext) -> str:
    """Sleeps ``seconds`` in small steps, stopping early when cancelled."""
    deadline = time.monotonic() + float(param.get("seconds", 1))
    while time.monotonic() < deadline:
        if context.is_cancelled():
            raise InterruptedError("cancelled while running")
        time.sleep(0.02)
    return "done"


@reliable_task_handler(name="demo.record", takes_context=True)
def record(param: dict | None, context: TaskContext) -> int:
    """Logs each execution in the Execution table (tests count them), then sleeps ``sleep``
    seconds — only in the first ``sleep_attempts`` attempts when that is given."""
    param = param or {}
    executions = Execution.objects.using(get_settings().DATABASE_ALIAS)  # beside the tasks
    row = executions.create(task_id=context.task_id, attempt=context.attempt, pid=os.getpid())
    seconds = float(param.get("sleep", 0))
    if seconds and context.attempt <= param.get("sleep_attempts", context.attempt):
        time.sleep(seconds)
    executions.filter(pk=row.pk).update(finished=True)
    return os.getpid()


@reliable_task_handler(name="demo.capped", max_concurrency=2)
def capped(param: dict | None = None) -> dict:
    """At most two run at once across every worker (max_concurrency); returns when it ran
    (``time.time()`` at its start and end) and where, after sleeping ``sleep`` seconds."""
    started = time.time()
    time.sleep(float((param or {}).get("sleep", 0.1)))
    return {"pid": os.getpid(), "started": started, "ended": time.time()}


@reliable_task_handler(name="demo.keyed", max_concurrency_per_key=2)
def keyed(param: dict | None = None) -> dict:
    """At most two of one ``concurrency_key`` run at once across every worker
    (max_concurrency_per_key); returns when it ran, as demo.capped does."""
    started = time.time()
    time.sleep(float((param or {}).get("sleep", 0.1)))
    return {"pid": os.getpid(), "started": started, "ended": time.time()}


@reliable_task_handler(name="demo.rated", takes_context=True, rate_limit="5/s")
def rated(param: dict | None, context: TaskContext) -> float:
    """At most five start in any second across every worker, per rate_key (rate_limit): writes
    a "start" record to the journal (RE_JOURNAL) as its first step and returns its start."""
    started = time.time()
    _journal("start", context, at=started)
    return started


@reliable_task_handler(name="demo.rated_wide", takes_context=True, rate_limit="40/s")
def rated_wide(param: dict | None, context: TaskContext) -> float:
    """demo.rated with room for 40 a second: a worker's claims start far below the limit
    (on SQLite, logged without a transaction) and end near it, within each window."""
    started = time.time()
    _journal("start", context, at=started)
    return started


# The limit of demo.rated_deploy, as a deploy would change it: RE_DEPLOY_RATE_LIMIT ("none":
# no limit).
_DEPLOY_RATE_LIMIT = os.environ.get("RE_DEPLOY_RATE_LIMIT", "2/h")


@reliable_task_handler(
    name="demo.rated_deploy",
    takes_context=True,
    rate_limit=None if _DEPLOY_RATE_LIMIT == "none" else _DEPLOY_RATE_LIMIT,
)
def rated_deploy(param: dict | None, context: TaskContext) -> float:
    """demo.rated under the limit RE_DEPLOY_RATE_LIMIT gives it (default "2/h"): a backlog held
    at one limit, then a worker started with another (the tests of a deploy changing it)."""
    started = time.time()
    _journal("start", context, at=started)
    return started


def _journal(event: str, context: TaskContext, **extra: object) -> None:
    """One line in the file named by RE_JOURNAL, written with a single O_APPEND write so that
    lines of concurrent processes never interleave. The fault tests read what ran when from
    here, not from the storage they are breaking."""
    path = os.environ.get("RE_JOURNAL")
    if not path:
        return
    line = json.dumps(
        {
            "task": context.task_id,
            "attempt": context.attempt,
            "pid": os.getpid(),
            "event": event,
            "t": time.time(),
            **extra,
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _result(param: dict, context: TaskContext) -> object:
    """What demo.journal and demo.async_journal return: ``result`` (default: the attempt), or
    with ``poison`` a value no result can be stored from: "bigint" (over Python's int-to-str
    digit limit) or "deep" (nested past any JSON encoder's recursion limit)."""
    poison = param.get("poison")
    if poison == "bigint":
        return 10**5000
    if poison == "deep":
        deep: list = []
        for _ in range(100_000):
            deep = [deep]
        return deep
    return param.get("result", context.attempt)


@reliable_task_handler(name="demo.debounced", takes_context=True)
def debounced(param: object, context: TaskContext) -> object:
    """Writes a "start" record with its parameter to the journal (RE_JOURNAL): the debounce
    proof (bench/debounce.py) reads which submit's parameter ran, and when."""
    _journal("start", context, param=param)
    return param


@reliable_task_handler(name="demo.fair", takes_context=True, fairness="round_robin")
def fair(param: dict | None, context: TaskContext) -> None:
    """Claims take its keys (concurrency_key, else rate_key) in turn (fairness): writes
    "start" and "end" records with its tenant to the journal (RE_JOURNAL) around ``sleep``
    seconds. The fairness proof (bench/fairness.py) reads which tenant ran when."""
    param = param or {}
    _journal("start", context, tenant=param.get("tenant"))
    time.sleep(float(param.get("sleep", 0)))
    _journal("end", context, tenant=param.get("tenant"))


@reliable_task_handler(name="demo.unfair", takes_context=True)
def unfair(param: dict | None, context: TaskContext) -> None:
    """demo.fair without fairness: the oldest due task first (bench/fairness.py's baseline)."""
    param = param or {}
    _journal("start", context, tenant=param.get("tenant"))
    time.sleep(float(param.get("sleep", 0)))
    _journal("end", context, tenant=param.get("tenant"))


@reliable_task_handler(
    name="demo.fair_keyed", fairness="round_robin", max_concurrency_per_key=2, max_concurrency=4
)
def fair_keyed(param: dict | None = None) -> None:
    """Fairness with a cap per concurrency_key (2) and on the name (4)."""


@reliable_task_handler(name="demo.fair_rated", fairness="round_robin", rate_limit="1000/s")
def fair_rated(param: dict | None = None) -> None:
    """Fairness with a rate limit: its keys are the rate keys."""


@reliable_task_handler(name="demo.journal", takes_context=True, retry_interval=50)
def journal(param: dict | None, context: TaskContext) -> object:
    """Writes "start" and "end" records to the journal (RE_JOURNAL) around ``sleep`` seconds of
    work (only in the first ``sleep_attempts`` attempts when that is given; cancellation is
    ignored); ``spin`` seconds instead hold the GIL in one C call (only in the first
    ``spin_attempts`` attempts when that is given); returns ``result`` (a poison
    value with ``poison``: "bigint" or "deep"). ``crash`` ends the process right after "start"
    (in the first ``crash_attempts`` attempts when that is given): "exit" with os._exit(3),
    "segv" by a SIGSEGV, as a crash in C code would."""
    param = param or {}
    _journal("start", context)
    crash = param.get("crash")
    if crash and context.attempt <= param.get("crash_attempts", context.attempt):
        if crash == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        os._exit(3)
    if param.get("sleep") and context.attempt <= param.get("sleep_attempts", context.attempt):
        time.sleep(float(param["sleep"]))
    if param.get("spin") and context.attempt <= param.get("spin_attempts", context.attempt):
        sum(range(int(float(param["spin"]) * 6 * 10**7)))  # one C call: the GIL is not let go
    result = _result(param, context)
    _journal("end", context)
    return result


@reliable_task_handler(
    name="demo.cooperative", takes_context=True, retry_on=(ConnectionError,), retry_interval=50
)
def cooperative(param: dict | None, context: TaskContext) -> object:
    """demo.journal's cooperative twin: "start", then ``sleep`` seconds in 10 ms steps (only in
    the first ``sleep_attempts`` attempts when that is given) checking
    ``context.is_cancelled()``; once it is True, writes "cancelled" and raises InterruptedError
    (outside its retry_on). Else writes "end" and returns the attempt."""
    param = param or {}
    _journal("start", context)
    if context.attempt <= param.get("sleep_attempts", context.attempt):
        ends = time.monotonic() + float(param.get("sleep", 0))
        while time.monotonic() < ends:
            if context.is_cancelled():
                _journal("cancelled", context)
                raise InterruptedError(f"attempt {context.attempt}: asked to stop")
            time.sleep(0.01)
    _journal("end", context)
    return context.attempt


@reliable_task_handler(
    name="demo.soak", takes_context=True, retry_on=(ConnectionError,), retry_interval=200
)
def soak(param: dict | None, context: TaskContext) -> int:
    """The soak benchmark's mix (bench/soak.py): writes a "start" record to the journal
    (RE_JOURNAL), then with ``retry_once`` fails its first attempt with ConnectionError
    (retried 200 ms later), with ``fail`` fails with RuntimeError (not retried), else
    completes."""
    param = param or {}
    _journal("start", context)
    if param.get("retry_once") and context.attempt == 1:
        raise ConnectionError("attempt 1: upstream not reachable")
    if param.get("fail"):
        raise RuntimeError("this soak task fails")
    return context.attempt


@reliable_task_handler(
    name="demo.async_sleep", takes_context=True, retry_on=(ConnectionError,), retry_interval=50
)
async def async_sleep(param: dict | None, context: TaskContext) -> object:
    """An ``async def`` handler: awaits ``asyncio.sleep(seconds)`` between "start" and "end"
    journal records (RE_JOURNAL), writing "cancelled" when the worker cancels it; fails the
    first ``fail_times`` attempts with ConnectionError (retried), or with ``fail`` every
    attempt with RuntimeError (not retried); returns ``result`` (default: the attempt)."""
    param = param or {}
    _journal("start", context, thread=threading.current_thread().name)
    try:
        await asyncio.sleep(float(param.get("seconds", 0)))
    except asyncio.CancelledError:
        _journal("cancelled", context)
        raise
    if context.attempt <= param.get("fail_times", 0):
        raise ConnectionError(f"attempt {context.attempt}: upstream not reachable")
    if param.get("fail"):
        raise RuntimeError("this async task always fails")
    _journal("end", context)
    return param.get("result", context.attempt)


@reliable_task_handler(name="demo.async_journal", takes_context=True, retry_interval=50)
async def async_journal(param: dict | None, context: TaskContext) -> object:
    """The ``async def`` twin of demo.journal for the fault tests: "start" and "end" records
    (RE_JOURNAL) around ``sleep`` seconds awaited (only in the first ``sleep_attempts`` attempts
    when that is given), then ``block`` seconds of ``time.sleep`` that hold up the whole event
    loop; returns ``result`` (default: the attempt), or a poison value with ``poison``. With
    ``record``, first writes an Execution row through ``sync_to_async``, as async handlers use
    the ORM. When the worker cancels it, writes "cancelled" at its ``await``; its
    finally-block always writes "finally"."""
    param = param or {}
    _journal("start", context, thread=threading.current_thread().name)
    try:
        if param.get("record"):
            executions = Execution.objects.using(get_settings().DATABASE_ALIAS)
            await sync_to_async(executions.create)(
                task_id=context.task_id, attempt=context.attempt, pid=os.getpid()
            )
        if param.get("sleep") and context.attempt <= param.get("sleep_attempts", context.attempt):
            await asyncio.sleep(float(param["sleep"]))
        if param.get("block"):
            time.sleep(float(param["block"]))  # no await: nothing else on the loop runs
        result = _result(param, context)
        _journal("end", context)
        return result
    except asyncio.CancelledError:
        _journal("cancelled", context)
        raise
    finally:
        _journal("finally", context)


def _released(param: dict) -> bool:
    """The file named by ``go`` exists: the test lets the handler finish."""
    return os.path.exists(param["go"])


@reliable_task_handler(name="demo.progress", takes_context=True)
def progress(param: dict, context: TaskContext) -> str:
    """Reports 1 of 3, waits (at most 30 s) for the file named by ``go``, reports 3 of 3."""
    context.set_progress(1, 3, "waiting")
    deadline = time.monotonic() + 30
    while not _released(param) and time.monotonic() < deadline:
        time.sleep(0.02)
    context.set_progress(3, 3, "done")
    return "done"


@reliable_task_handler(name="demo.async_progress", takes_context=True)
async def async_progress(param: dict, context: TaskContext) -> str:
    """The ``async def`` twin of demo.progress."""
    context.set_progress(1, 3, "waiting")
    deadline = time.monotonic() + 30
    while not _released(param) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    context.set_progress(3, 3, "done")
    return "done"


@reliable_task_handler(name="demo.batch_report", takes_context=True)
def batch_report(param: dict | None, context: TaskContext) -> str | None:
    """A batch's callback: writes a "report" record naming its batch (context.batch_id) to the
    journal (RE_JOURNAL), from which the batch tests count how often callbacks ran."""
    _journal("report", context, batch=context.batch_id, kind=(param or {}).get("kind"))
    return context.batch_id


class NotRetried(Exception):
    """Outside demo.unstorable_text's retry_on."""


#: A NUL (which PostgreSQL cannot store) and a lone surrogate (which no storage can).
UNSTORABLE = "\x00 and \udc80"


@reliable_task_handler(
    name="demo.unstorable_text", takes_context=True, retry_on=(ConnectionError,), retry_interval=50
)
def unstorable_text(param: dict, context: TaskContext) -> str:
    """Writes an Execution row (tests count the runs), then with ``fail`` raises NotRetried
    (not in retry_on) whose message holds UNSTORABLE; else reports progress whose message
    holds it, waits (at most 30 s) for the file named by ``go``, and returns."""
    executions = Execution.objects.using(get_settings().DATABASE_ALIAS)  # beside the tasks
    executions.create(task_id=context.task_id, attempt=context.attempt, pid=os.getpid())
    if param.get("fail"):
        raise NotRetried(f"cannot go on: {UNSTORABLE}")
    context.set_progress(1, 2, f"{context.task_id}: {UNSTORABLE}")
    deadline = time.monotonic() + 30
    while not _released(param) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "done"


def _raise_exit(kind: str) -> None:
    """Raise the BaseException named by ``kind``: "SystemExit" (sys.exit(3)) or
    "KeyboardInterrupt" (as Ctrl-C would in the main thread)."""
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt("raised by the handler")
    sys.exit(3)


@reliable_task_handler(
    name="demo.exits",
    takes_context=True,
    retry_on=(SystemExit, KeyboardInterrupt),
    retry_interval=50,
)
def exits(param: dict, context: TaskContext) -> int:
    """Writes "start" to the journal (RE_JOURNAL), then, in the first ``exit_attempts``
    attempts, raises the BaseException ``raise`` names (see _raise_exit): retried, as its
    retry_on includes both. Returns the attempt once it gets past them."""
    _journal("start", context, thread=threading.current_thread().name)
    if context.attempt <= param.get("exit_attempts", 1):
        _raise_exit(param["raise"])
    _journal("end", context)
    return context.attempt


@reliable_task_handler(name="demo.async_exits", takes_context=True, retry_interval=50)
async def async_exits(param: dict, context: TaskContext) -> int:
    """demo.exits, async and with the default retry_on (Exception): a SystemExit or
    KeyboardInterrupt fails the task (FAILED, not retried). With ``kill_loop``, instead ends
    the event loop's thread from outside any handler (in the first ``exit_attempts``
    attempts): a callback of the loop raises SystemExit (asyncio lets it out of run_forever),
    while this handler awaits ``sleep`` seconds."""
    _journal("start", context, thread=threading.current_thread().name)
    await asyncio.sleep(0)
    if param.get("kill_loop") and context.attempt <= param.get("exit_attempts", 1):
        asyncio.get_running_loop().call_soon(_raise_exit, "SystemExit")
        await asyncio.sleep(float(param.get("sleep", 30)))
    elif context.attempt <= param.get("exit_attempts", 1):
        _raise_exit(param["raise"])
    _journal("end", context)
    return context.attempt


@reliable_task_handler(name="demo.kills_its_thread", takes_context=True)
def kills_its_thread(param: dict | None, context: TaskContext) -> str:
    """Writes "start" to the journal, then has SystemExit raised in its own thread 0.2 s later,
    from another thread (as a fault in the worker's own code would end it): by then the
    handler has returned, and the pool thread is back in the worker's code. Returns its
    thread's name."""
    import ctypes

    name = threading.current_thread().name
    _journal("start", context, thread=name)
    target = threading.get_ident()

    def strike() -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(target), ctypes.py_object(SystemExit)
        )

    threading.Timer(0.2, strike).start()
    return name


def _outlive_seconds(param: dict, context: TaskContext) -> float:
    """How long demo.outlive and its twins run: ``seconds``, only in the first attempt with
    ``first_only`` (a retried one then returns at once)."""
    if param.get("first_only") and context.attempt > 1:
        return 0.0
    return float(param.get("seconds", 0))


def outlive(param: dict | None, context: TaskContext) -> int:
    """Outlives its attempt (tests/races/test_ended_matrix.py): writes "start" to the journal
    (RE_JOURNAL), runs ``seconds`` whatever ``context.is_cancelled()`` says (neither a
    TIMEOUT nor a cancel stops it), writes "end", then raises with ``fail``, else returns."""
    param = param or {}
    _journal("start", context)
    time.sleep(_outlive_seconds(param, context))
    _journal("end", context)
    if param.get("fail"):
        raise RuntimeError("demo.outlive failed as asked")
    return context.attempt


async def async_outlive(param: dict | None, context: TaskContext) -> int:
    """The ``async def`` twin of demo.outlive: the worker's CancelledError (a TIMEOUT, a cancel)
    is written down ("cancelled") and ignored, and it awaits on until ``seconds`` passed."""
    param = param or {}
    _journal("start", context)
    ends = time.monotonic() + _outlive_seconds(param, context)
    while (left := ends - time.monotonic()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            _journal("cancelled", context)
    _journal("end", context)
    if param.get("fail"):
        raise RuntimeError("demo.async_outlive failed as asked")
    return context.attempt


reliable_task_handler(name="demo.outlive", takes_context=True, retry_limit=0)(outlive)
reliable_task_handler(name="demo.async_outlive", takes_context=True, retry_limit=0)(async_outlive)
# One at a time (max_concurrency): a timed-out run whose handler runs on still holds the slot.
reliable_task_handler(
    name="demo.outlive_capped", takes_context=True, retry_limit=0, max_concurrency=1
)(outlive)
reliable_task_handler(
    name="demo.async_outlive_capped", takes_context=True, retry_limit=0, max_concurrency=1
)(async_outlive)


@reliable_task_handler(
    name="demo.fails_on_a_killed_connection",
    takes_context=True,
    retry_on=(ConnectionError,),
    retry_interval=50,
)
def fails_on_a_killed_connection(context: TaskContext) -> None:
    """Writes an Execution row (tests count the runs), has the database server end this
    thread's connection to the task database (as a restart, failover or proxy timeout does:
    the worker's failure write meets it next), then raises NotRetried (not in retry_on). On
    SQLite, and for Redis (the task database is then not the storage), nothing is killed."""
    from django.db import DatabaseError, connections

    alias = get_settings().DATABASE_ALIAS
    Execution.objects.using(alias).create(
        task_id=context.task_id, attempt=context.attempt, pid=os.getpid()
    )
    connection = connections[alias]
    kill = {
        "postgresql": "SELECT pg_terminate_backend(pg_backend_pid())",
        "mysql": "KILL CONNECTION CONNECTION_ID()",
    }.get(connection.vendor)
    if kill is not None and get_settings().STORAGE == "database":
        try:
            with connection.cursor() as cursor:
                cursor.execute(kill)
        except DatabaseError:
            pass  # the server ended the connection under its own statement
    raise NotRetried("failed after the server ended its connection")


def _chaos(param: dict | None, context: TaskContext) -> object:
    """The chaos soak's handlers (bench/chaos_soak.py): a "start" record, then ``sleep`` seconds
    of work; fails the first ``fail_times`` attempts with ConnectionError (retried), or with
    ``fail`` every attempt with RuntimeError (not retried); returns the attempt, or a poison
    value with ``poison``. Always ends with an "end" record naming the ``outcome`` ("return",
    "retryable", "fatal"), so a re-execution can be told from the handler's own failure."""
    param = param or {}
    _journal("start", context)
    outcome = "fatal"
    try:
        if param.get("sleep"):
            time.sleep(float(param["sleep"]))
        if context.attempt <= param.get("fail_times", 0):
            outcome = "retryable"
            raise ConnectionError(f"attempt {context.attempt}: upstream not reachable")
        if param.get("fail"):
            raise RuntimeError("this chaos task fails")
        result = _result(param, context)
        outcome = "return"
        return result
    finally:
        _journal("end", context, outcome=outcome)


@reliable_task_handler(
    name="demo.chaos", takes_context=True, retry_on=(ConnectionError,), retry_interval=100
)
def chaos(param: dict | None, context: TaskContext) -> object:
    """The chaos soak's mix (see _chaos)."""
    return _chaos(param, context)


@reliable_task_handler(
    name="demo.chaos_rated",
    takes_context=True,
    retry_on=(ConnectionError,),
    retry_interval=100,
    rate_limit="5/s",
)
def chaos_rated(param: dict | None, context: TaskContext) -> object:
    """demo.chaos under a rate limit: at most five start in any second across every worker."""
    return _chaos(param, context)


@reliable_task_handler(
    name="demo.chaos_capped",
    takes_context=True,
    retry_on=(ConnectionError,),
    retry_interval=100,
    max_concurrency=2,
)
def chaos_capped(param: dict | None, context: TaskContext) -> object:
    """demo.chaos under max_concurrency: at most two run at once across every worker."""
    return _chaos(param, context)


@reliable_task_handler(
    name="demo.chaos_keyed1",
    takes_context=True,
    retry_on=(ConnectionError,),
    retry_interval=100,
    max_concurrency_per_key=1,
)
def chaos_keyed1(param: dict | None, context: TaskContext) -> object:
    """demo.chaos under max_concurrency_per_key: at most one of a concurrency_key runs at once
    across every worker."""
    return _chaos(param, context)


@reliable_task_handler(
    name="demo.chaos_keyed3",
    takes_context=True,
    retry_on=(ConnectionError,),
    retry_interval=100,
    max_concurrency_per_key=3,
)
def chaos_keyed3(param: dict | None, context: TaskContext) -> object:
    """demo.chaos under max_concurrency_per_key: at most three of a concurrency_key run at once
    across every worker."""
    return _chaos(param, context)


# The durable steps of demo.steps and demo.async_steps, in order.
STEP_NAMES = ("one", "two", "three")


def _step(param: dict, context: TaskContext, name: str) -> str:
    """One step of demo.steps: a "step" journal record; in step ``hang`` of the first
    ``hang_attempts`` attempts (default 1), a "hang" record, then ``sleep`` seconds (the test
    kills the process meanwhile, before the step's checkpoint); step ``fail`` of the first
    attempt raises ConnectionError. With ``atomic``, step "two" first writes an Execution row
    (task id "<task>:two") on the task database's alias (after the hang with ``late_write``):
    an ``atomic=True`` step, whose row commits only with its checkpoint."""
    _journal("step", context, step=name)
    write = param.get("atomic") and name == "two"
    if write and not param.get("late_write"):
        _write_execution(context, name)
    if name == param.get("hang") and context.attempt <= param.get("hang_attempts", 1):
        _journal("hang", context, step=name)
        time.sleep(float(param.get("sleep", 60)))
    if write and param.get("late_write"):  # after the hang: a stale attempt's write
        _write_execution(context, name)
    if name == param.get("fail") and context.attempt == 1:
        raise ConnectionError(f"step {name} failed in attempt 1")
    return f"{name}@{context.attempt}"


def _write_execution(context: TaskContext, name: str) -> None:
    Execution.objects.using(get_settings().DATABASE_ALIAS).create(
        task_id=f"{context.task_id}:{name}", attempt=context.attempt, pid=os.getpid()
    )
    _journal("wrote", context, step=name)


@reliable_task_handler(name="demo.steps", takes_context=True, retry_interval=100)
def steps(param: dict | None, context: TaskContext) -> list[str]:
    """Three durable steps (STEP_NAMES, see _step), with journal records around and between
    them (RE_JOURNAL): "start", "after" each step (code between steps runs in every attempt),
    "end". Returns each step's result: "<name>@<attempt that ran it>"."""
    param = param or {}
    _journal("start", context)
    done = []
    for name in STEP_NAMES:
        atomic = bool(param.get("atomic")) and name == "two"
        done.append(context.step(name, _step, param, context, name, atomic=atomic))
        _journal("after", context, step=name)
    _journal("end", context)
    return done


async def _async_step(param: dict, context: TaskContext, name: str) -> str:
    """_step of demo.async_steps: the hang awaited (asyncio.sleep)."""
    _journal("step", context, step=name)
    if name == param.get("hang") and context.attempt <= param.get("hang_attempts", 1):
        _journal("hang", context, step=name)
        await asyncio.sleep(float(param.get("sleep", 60)))
    return f"{name}@{context.attempt}"


@reliable_task_handler(name="demo.async_steps", takes_context=True, retry_interval=100)
async def async_steps(param: dict | None, context: TaskContext) -> list[str]:
    """The ``async def`` twin of demo.steps: ``await context.step(...)`` of async steps."""
    param = param or {}
    _journal("start", context)
    done = []
    for name in STEP_NAMES:
        done.append(await context.step(name, _async_step, param, context, name))
        _journal("after", context, step=name)
    _journal("end", context)
    return done


def _wait(param: dict, context: TaskContext) -> dict:
    """The wait of demo.waits: ``wait`` "sleep" (``seconds``), "event" (event "go", with
    ``timeout``) or "tasks" (``task_ids``). Returns what it gave back."""
    kind = param["wait"]
    if kind == "sleep":
        return {"slept": context.sleep("nap", float(param.get("seconds", 1)))}
    if kind == "event":
        return {"event": context.wait_for_event("go", timeout=param.get("timeout"))}
    ended = context.wait_for("children", param["task_ids"], timeout=param.get("timeout"))
    return {"ended": {task_id: info.status.value for task_id, info in ended.items()}}


@reliable_task_handler(name="demo.waits", takes_context=True, retry_interval=100)
def waits(param: dict, context: TaskContext) -> dict:
    """A durable step, then a durable wait (see _wait), then a second step, with journal
    records (RE_JOURNAL): "start" each time the handler is called (resumptions counted),
    "step" when a step's function runs, "resumed" once the wait returned, "end"."""
    _journal("start", context, resumptions=context.resumptions)

    def step(name: str) -> str:
        _journal("step", context, step=name)
        return f"{name}@{context.resumptions}"

    first = context.step("before", step, "before")
    got = _wait(param, context)
    _journal("resumed", context, resumptions=context.resumptions, got=got)
    second = context.step("after", step, "after")
    _journal("end", context)
    return {"steps": [first, second], **got}


@reliable_task_handler(name="demo.async_waits", takes_context=True, retry_interval=100)
async def async_waits(param: dict, context: TaskContext) -> dict:
    """The ``async def`` twin of demo.waits: each step and wait awaited."""
    _journal("start", context, resumptions=context.resumptions)

    def step(name: str) -> str:
        _journal("step", context, step=name)
        return f"{name}@{context.resumptions}"

    first = await context.step("before", step, "before")
    kind = param["wait"]
    if kind == "sleep":
        got = {"slept": await context.sleep("nap", float(param.get("seconds", 1)))}
    elif kind == "event":
        got = {"event": await context.wait_for_event("go", timeout=param.get("timeout"))}
    else:
        ended = await context.wait_for("children", param["task_ids"])
        got = {"ended": {task_id: info.status.value for task_id, info in ended.items()}}
    _journal("resumed", context, resumptions=context.resumptions, got=got)
    second = await context.step("after", step, "after")
    _journal("end", context)
    return {"steps": [first, second], **got}


@reliable_task_handler(name="demo.stepper", takes_context=True)
def stepper(param: dict | None, context: TaskContext) -> int:
    """``steps`` durable steps that do nothing (bench/durable.py: a checkpoint's cost)."""
    steps = int((param or {}).get("steps", 10))
    for number in range(steps):
        context.step(f"s{number}", int, number)
    return steps


@reliable_task_handler(name="demo.sleeper", takes_context=True)
def sleeper(param: dict | None, context: TaskContext) -> str:
    """One durable sleep of ``seconds`` (default a day), then "woke" (bench/durable.py)."""
    context.sleep("nap", float((param or {}).get("seconds", 86400)))
    return "woke"


@reliable_task_handler(name="demo.capped_waits", takes_context=True, max_concurrency=1)
def capped_waits(param: dict, context: TaskContext) -> object:
    """demo.waits' wait under max_concurrency=1: a waiting task holds no slot."""
    return _wait(param, context)
