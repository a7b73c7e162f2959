"""Helpers of the management command tests: ``executor`` in process (run) and manage.py in a
subprocess with the test databases' settings (manage, process_env)."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys

from django.core.management import CommandError, call_command

from tests.support.processes import _OVERRIDDEN, MANAGE, ROOT, Backend


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


class Terminal(io.StringIO):
    """A StringIO that says it is a terminal (stderr for the progress line, stdin to answer)."""

    def isatty(self) -> bool:
        return True


def run(*args: str, stderr: io.StringIO | None = None, stdin: io.StringIO | None = None) -> Result:
    """call_command("executor", *args); a CommandError becomes its exit code and message, as
    manage.py turns it into them."""
    out, err = io.StringIO(), stderr or io.StringIO()
    extra = {"stdin": stdin} if stdin is not None else {}
    try:
        call_command("executor", *args, stdout=out, stderr=err, **extra)
        code = 0
    except CommandError as exc:
        code = exc.returncode
        err.write(f"CommandError: {exc}\n")
    return Result(code, out.getvalue(), err.getvalue())


# -- as a real process: the exit codes a shell sees ------------------------------------------
def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "executor", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def process_env(backend: Backend | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _OVERRIDDEN}
    env.update(DJANGO_SETTINGS_MODULE="testproject.settings", RE_DEBUG="0", **extra)
    if backend is not None:
        env.update(backend.environment())
    return env
