"""Contract: text no storage can hold (NUL, a lone surrogate) is refused at submit naming its
field when a caller gives it, and stored altered, saying so, when a worker writes it; one
progress report the storage refuses never drops the others' (every storage)."""

from __future__ import annotations

from typing import Any

import pytest

from django_reliable_executor import TaskStatus, TaskSubmitError, TaskSubmitRequest
from django_reliable_executor.core.progress import make_progress
from django_reliable_executor.core.text import storable_text
from django_reliable_executor.exceptions import (
    InvalidDependencyError,
    InvalidParameterError,
    InvalidTaskIdError,
    InvalidTaskOptionError,
    UnknownTaskError,
)
from django_reliable_executor.worker.progress_writer import ProgressWriter
from tests.support.contract_support import HOOKS, LEASE, assert_refused, run_next

NUL = "\x00"
SURROGATE = "\udc80"
BAD = pytest.mark.parametrize("bad", [NUL, SURROGATE], ids=["nul", "surrogate"])
# A submit's fields a caller fills with text: (the submit's options, the field, the error).
FIELDS = [
    ({"task_id": "a{}b"}, "task_id", InvalidTaskIdError),
    ({"queue": "q{}"}, "queue", InvalidTaskOptionError),
    ({"rate_key": "k{}"}, "rate_key", InvalidTaskOptionError),
    ({"unique_for": 60, "unique_key": "k{}"}, "unique_key", InvalidTaskOptionError),
    ({"depends_on": ["existing", "x{}"]}, "depends_on", InvalidDependencyError),
    ({"task_parameter": {"note": "a{}b"}}, "task_parameter", InvalidParameterError),
    ({"task_name": "demo.echo{}"}, "task_name", UnknownTaskError),
]
FIELD_IDS = ["task_id", "queue", "rate_key", "unique_key", "depends_on", "parameter"]


def _options(template: dict[str, Any], bad: str) -> dict[str, Any]:
    """``template`` with ``bad`` where its "{}" is (in a string, a key or a list)."""

    def fill(value: Any) -> Any:
        if isinstance(value, str):
            return value.replace("{}", bad)
        if isinstance(value, dict):
            return {fill(k): fill(v) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v) for v in value]
        return value

    return fill(template)


def _request(options: dict[str, Any]) -> TaskSubmitRequest:
    fields = {"task_name": "demo.echo", **options}
    if "task_parameter" not in fields:
        fields["task_parameter"] = {"n": 1}
    return TaskSubmitRequest(**fields)


@BAD
@pytest.mark.parametrize(("template", "field", "error"), FIELDS, ids=[*FIELD_IDS, "task_name"])
def test_a_caller_text_no_storage_can_hold_is_refused_naming_its_field(
    seeded, bad, template, field, error
):
    request = _request(_options(template, bad))
    refused = assert_refused(seeded, error, field, lambda: seeded.submit_task(request))
    assert (repr(bad)[1:-1] in str(refused)) or ("NUL" if bad == NUL else "surrogate") in str(
        refused
    )


@BAD
@pytest.mark.parametrize(("template", "field", "error"), FIELDS, ids=[*FIELD_IDS, "task_name"])
def test_a_multi_task_submit_with_one_such_text_stores_none(seeded, bad, template, field, error):
    good = TaskSubmitRequest("demo.echo", {"n": 2}, task_id="good")
    bad_request = _request(_options(template, bad))
    assert_refused(seeded, error, field, lambda: seeded.submit_many([good, bad_request]))
    assert_refused(seeded, error, field, lambda: seeded.chain([good, bad_request]))
    assert_refused(
        seeded, error, field, lambda: seeded.submit_batch([good, bad_request], batch_id="b")
    )
    assert seeded.get_batch("b") is None


@BAD
def test_a_batch_id_no_storage_can_hold_is_refused(seeded, bad):
    good = TaskSubmitRequest("demo.echo", {"n": 2}, task_id="good")
    assert_refused(
        seeded, TaskSubmitError, "batch_id", lambda: seeded.submit_batch([good], batch_id=f"b{bad}")
    )


def test_storable_text_replaces_and_says_so_and_keeps_good_text_as_it_is():
    assert storable_text("plain") == "plain"
    kept = "héllo 😀 ✓"
    assert storable_text(kept) is kept
    altered = storable_text(f"a{NUL}b{SURROGATE}c\ud83d")
    assert altered.startswith("a\ufffdb\ufffdc\ufffd")
    assert "text altered: 3 NUL or surrogate character(s) replaced by U+FFFD" in altered
    altered.encode("utf-8")  # every storage's encoding takes it
    assert storable_text(f"Traceback\nValueError: {NUL}\n").endswith(
        "ValueError: \ufffd\n(text altered: 1 NUL or surrogate character(s) replaced by U+FFFD)"
    )


def test_a_handler_error_no_storage_can_hold_is_stored_altered(executor):
    """In-process (the worker's TaskRunner): the failure is recorded at once, the handler's
    message kept but for the bad characters. tests/races/test_process_unstorable_text.py runs it
    with real workers."""
    executor.submit("contract.hook", None, task_id="bad-error", retry_limit=0)

    def fail(context):
        raise ValueError(f"key {NUL} and {SURROGATE} end")

    HOOKS["bad-error"] = fail
    assert run_next(executor) is TaskStatus.FAILED
    info = executor.get_task("bad-error")
    assert info.attempts == 1
    assert "ValueError: key \ufffd and \ufffd end" in info.last_error
    assert info.last_error.endswith(
        "end\n(text altered: 2 NUL or surrogate character(s) replaced by U+FFFD)"
    )


def test_a_progress_message_no_storage_can_hold_is_stored_altered(executor, clock):
    executor.submit("contract.hook", None, task_id="bad-progress")

    def report(context):
        context.set_progress(1, 2, f"step {NUL} {SURROGATE}")

    HOOKS["bad-progress"] = report
    assert run_next(executor) is TaskStatus.COMPLETED
    progress = executor.get_task("bad-progress").progress
    assert progress is not None
    assert progress["current"] == 1
    assert progress["message"].startswith("step \ufffd \ufffd (text altered: 2 ")


def test_a_progress_report_the_storage_refuses_never_drops_the_others(executor, storage, clock):
    """The rule of the completion writer: a batch refused is written again report by report.
    The refused report is built around make_progress (which would have made it storable), as a
    storage's other limits might refuse one."""
    for name in ("p1", "p2", "p3"):
        executor.submit("contract.hook", None, task_id=name)
    claims = sorted(
        filter(None, storage.start_many(storage.claim("w1", ["default"], 10, LEASE), LEASE)),
        key=lambda claim: claim.task_id,
    )
    assert [claim.task_id for claim in claims] == ["p1", "p2", "p3"]
    now = clock.now()
    good = [(claim, make_progress(1, 3, f"{claim.task_id} ok", now)) for claim in claims[::2]]
    unstorable = {**make_progress(2, 3, "", now), "message": f"bad {SURROGATE}"}
    batch = [good[0], (claims[1], unstorable), good[1]]
    writer: ProgressWriter[Any] = ProgressWriter(storage.record_progress)
    # The batch its thread would write (called directly: which reports share a batch is
    # up to the thread's timing).
    writer._write_logged(batch)
    stored = {claim.task_id: executor.get_task(claim.task_id).progress for claim in claims}
    assert stored[claims[0].task_id]["message"] == f"{claims[0].task_id} ok"
    assert stored[claims[2].task_id]["message"] == f"{claims[2].task_id} ok"
    assert stored[claims[1].task_id] is None


@BAD
def test_looking_up_such_an_id_finds_nothing(seeded, bad):
    """No stored task can hold such text (submits refuse it): a lookup answers "not found"
    rather than the storage raising (PostgreSQL refuses a NUL even in a query)."""
    bad_id = f"existing{bad}"
    assert seeded.get_task(bad_id) is None
    assert seeded.cancel_task(bad_id) is False
    assert seeded.retry_task_or_reason(bad_id) == "not found"
    assert seeded.dependents_of(bad_id) == []
    assert seeded.get_batch(bad_id) is None
    assert seeded.list_tasks(queue=f"q{bad}") == []
    assert seeded.list_tasks(task_name=f"demo.echo{bad}") == []
    assert seeded.list_tasks(batch_id=bad_id) == []
    assert seeded.get_task("existing").status is TaskStatus.CREATED  # untouched
