"""A deploy that raises or removes a rate_limit releases the backlog held under the old one, with
real runexecutor workers on every storage: what ran is read from the handlers' own records (the
journal demo.rated_deploy writes as its first step)."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_reliable_executor import TaskStatus
from tests.conftest import require
from tests.support.processes import Backend, read_journal, service_for, wait_until


@pytest.mark.parametrize("new_limit", ["none", "100/s"])
def test_a_deploy_raising_or_removing_a_rate_limit_runs_the_held_backlog(
    alias, new_limit, key_prefix, workers, tmp_path: Path
):
    """Ten tasks under "2/h": the first worker runs two and holds the other eight back (their
    slots half an hour apart). It is stopped, and a worker whose code has the new limit (no
    limit, or "100/s") is started with --burst: it runs every held task before it finds
    nothing due within a minute and exits."""
    require(alias)
    backend = Backend(alias, key_prefix)
    service = service_for(backend)
    journal = tmp_path / "journal.jsonl"
    ids = [service.submit("demo.rated_deploy", {}).task_id for _ in range(10)]

    def started() -> list[str]:
        return [record["task"] for record in read_journal(journal)]

    def first_two_done() -> bool:
        ran = started()
        return len(ran) >= 2 and all(
            service.get_task(i).status is TaskStatus.COMPLETED for i in ran
        )

    old = workers.start(backend, env={"RE_JOURNAL": str(journal), "RE_DEPLOY_RATE_LIMIT": "2/h"})
    wait_until(first_two_done, 60, "the first worker did not run two", logs=workers.logs)
    old.terminate()
    assert old.wait(60) == 0, old.log()
    assert len(started()) == 2  # the limit held: the other eight wait for later slots
    held = [i for i in ids if i not in started()]
    assert {service.get_task(i).status for i in held} == {TaskStatus.CREATED}

    new = workers.start(
        backend,
        "--burst",
        env={"RE_JOURNAL": str(journal), "RE_DEPLOY_RATE_LIMIT": new_limit},
        wait_ready=False,
    )
    assert new.wait(90) == 0, new.log()
    assert sorted(started()) == sorted(ids), workers.logs()  # each handler began once
    assert {service.get_task(i).status for i in ids} == {TaskStatus.COMPLETED}
    service.storage.close()
