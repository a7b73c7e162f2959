"""The test project's settings without a LOGGING entry, as a project made by startproject has
(tests/races/test_process_worker_output.py: what runexecutor shows such a project)."""

from .settings import *  # noqa: F403

LOGGING: dict = {}
