"""Fixtures of the fault-injection suite: a journal the handlers write, and the faults done."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.journal import Faults, Journal


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(tmp_path / "journal.jsonl")


@pytest.fixture
def faults() -> Faults:
    return Faults()
