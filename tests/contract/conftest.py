"""The contract tests' fixtures beyond the suite-wide ones: ``seeded``, an executor holding one
task."""

from __future__ import annotations

import pytest


@pytest.fixture
def seeded(executor, clock):
    """An executor holding one valid task, so "stores nothing" is checked against real state."""
    executor.submit("demo.echo", {"keep": True}, task_id="existing", queue="q")
    clock.advance(1)
    return executor
