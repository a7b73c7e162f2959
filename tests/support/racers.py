"""Submitters racing each other from separate processes (tests/support/racer_child.py): each
connects, waits at a barrier (a file the test creates once every process is ready), then submits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .processes import MANAGE, ROOT, Backend, _die_with_parent

_OWN = ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")


def start_racers(
    backend: Backend, count: int, folder: Path, submit: dict
) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` processes that each call ``executor.submit(**submit)`` once the test
    releases them with ``release``; each prints what its submit returned as a JSON line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RE_") and k not in _OWN}
    env.update(backend.environment())
    env.update(
        DJANGO_SETTINGS_MODULE="testproject.settings",
        PYTHONPATH=os.pathsep.join([str(MANAGE.parent), str(ROOT)]),
        RE_DEBUG="0",
    )
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.racer_child",
                str(folder),
                str(i),
                json.dumps(submit),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        for i in range(count)
    ]


def release(folder: Path, racers: list[subprocess.Popen[bytes]], timeout: float = 120.0) -> None:
    """Wait until every racer is ready (connected, its first query done), then let them all go
    at once."""
    deadline = time.monotonic() + timeout
    while len(list(folder.glob("ready-*"))) < len(racers):
        for racer in racers:
            if racer.poll() is not None:
                raise AssertionError(f"a racer exited early:\n{racer.communicate()[1].decode()}")
        if time.monotonic() > deadline:
            raise AssertionError("the racers did not all get ready")
        time.sleep(0.02)
    (folder / "go").touch()


def race(backend: Backend, count: int, folder: Path, submit: dict) -> set[str]:
    """``count`` racers released together (``start_racers``, ``release``), each having to
    exit cleanly; returns the task ids their submits returned."""
    racers = start_racers(backend, count, folder, submit)
    try:
        release(folder, racers)
        outputs = [racer.communicate(timeout=120) for racer in racers]
    finally:
        for racer in racers:
            racer.kill()
            racer.wait()
    for racer, (_out, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err.decode()
    return {json.loads(out.decode().strip().splitlines()[-1])["task_id"] for out, _ in outputs}
