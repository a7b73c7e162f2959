"""The unit tier: the core's pure parts, one file per module, without a storage or a test
database; it runs in seconds (``pytest tests/unit``). Fixtures shared by its files live here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_reliable_executor import registry


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Task names registered by a test; unregistered afterwards."""
    registered: list[str] = []
    yield registered
    for name in registered:
        registry.unregister(name)
