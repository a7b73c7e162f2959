"""A task database without the app's tables (migrate not run): runexecutor refuses to start,
and executor health and status say so, each naming the command to run, without a
traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.processes import MANAGE, ROOT

FIX = "tables missing on database 'default': run python manage.py migrate (unapplied: "


@pytest.mark.parametrize(
    ("command", "code"),
    [(["runexecutor"], 1), (["executor", "health"], 1), (["executor", "status"], 3)],
)
def test_a_database_without_the_tables_is_named_with_the_command_to_run(tmp_path, command, code):
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("RE_DATABASE", "RE_TEST_DB_NAMES", "RE_STORAGE")
    }
    env["RE_SQLITE_PATH"] = str(tmp_path / "never-migrated.sqlite3")
    done = subprocess.run(
        [sys.executable, str(MANAGE), *command, "--settings", "testproject.settings_newcomer"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == code, output
    assert FIX in output and "django_reliable_executor.0001_initial" in output, output
    assert "Traceback" not in output, output
