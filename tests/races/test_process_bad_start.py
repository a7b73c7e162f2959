"""runexecutor's refusals at start, each one clear message without a traceback: Redis that
does not answer (refused by runexecutor itself; --wait waits for it, a line per attempt), a
misspelled settings key (the system check report, naming the key it probably meant)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.processes import MANAGE, ROOT
from tests.support.redis_servers import free_port


def runexecutor(tmp_path: Path, *args: str, timeout: float = 60, **env: str):
    variables = {
        key: value
        for key, value in os.environ.items()
        if key not in ("RE_DATABASE", "RE_TEST_DB_NAMES", "RE_STORAGE", "RE_REDIS_URL")
    }
    variables.update(RE_SQLITE_PATH=str(tmp_path / "db.sqlite3"), **env)
    variables["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    command = [sys.executable, str(MANAGE), "runexecutor", *args]
    return subprocess.run(
        command, cwd=ROOT, env=variables, capture_output=True, text=True, timeout=timeout
    )


def test_redis_that_does_not_answer_is_refused_at_start(tmp_path):
    down = f"redis://127.0.0.1:{free_port()}/0"
    done = runexecutor(
        tmp_path, "--settings", "testproject.settings_newcomer", RE_STORAGE="redis",
        RE_REDIS_URL=down,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "CommandError: Redis at" in output and "`runexecutor --wait` waits for it" in output, (
        output
    )
    assert "Traceback" not in output, output


def test_with_wait_it_waits_for_redis_a_line_per_attempt(tmp_path):
    down = f"redis://127.0.0.1:{free_port()}/0"
    try:
        runexecutor(
            tmp_path, "--wait", "--settings", "testproject.settings_newcomer", timeout=5,
            RE_STORAGE="redis", RE_REDIS_URL=down,
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode() + (expired.stderr or b"").decode()
    else:
        raise AssertionError("runexecutor --wait did not wait")
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) >= 2, output
    assert all(line.startswith("waiting for the task store: Redis at") for line in lines), output


def test_a_misspelled_settings_key_gets_the_check_report(tmp_path):
    (tmp_path / "typo_settings.py").write_text(
        "from testproject.settings_newcomer import *  # noqa: F403\n"
        'RELIABLE_EXECUTOR = {"LEASE_TIMOUT": 30, "POLL_INTERVAL": -1}\n'
    )
    done = runexecutor(tmp_path, "--settings", "typo_settings")
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "is not a known key (did you mean 'LEASE_TIMEOUT'?)" in output, output
    assert "RELIABLE_EXECUTOR['POLL_INTERVAL'] = -1 is invalid" in output, output  # both named
    assert "Traceback" not in output, output
