"""The Lua transition scripts: read from storage/lua/, prefixed with _common.lua, run by EVALSHA."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

LUA_PACKAGE = "django_reliable_executor.storage"
NAMES = (
    "submit",
    "claim",
    "start",
    "heartbeat",
    "complete",
    "fail",
    "expire_claim",
    "release",
    "cancel",
    "retry",
    "promote",
    "recover",
    "expire",
    "purge",
    "forget_queues",
    "lock_acquire",
    "lock_release",
    "schedule_save",
    "schedule_pause",
    "schedule_delete",
    "schedule_fire",
    "schedule_due",
)


@functools.cache
def source(name: str) -> str:
    """The full text of one script: the shared prelude, then the script itself."""
    folder = resources.files(LUA_PACKAGE).joinpath("lua")
    prelude = folder.joinpath("_common.lua").read_text(encoding="utf-8")
    return prelude + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")


class Scripts:
    """Every transition script registered on one client. redis-py sends EVALSHA and loads the
    script once when the server does not know it (first use, or after a restart)."""

    def __init__(self, client: Any) -> None:
        self._scripts = {name: client.register_script(source(name)) for name in NAMES}

    def __getattr__(self, name: str) -> Any:
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None
