"""The Lua transition scripts of storage/redis/lua/, prefixed with _common.lua, run by EVALSHA."""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

LUA_PACKAGE = "django_reliable_executor.storage.redis"
# Most connections kept idle for run(): a worker's fetcher, start batches, completion writer,
# heartbeat and chores. More callers at once borrow more, given back to the pool after the
# call, so a small pool shared with a cache is never drained by connections kept here.
KEPT_CONNECTIONS = 4
NAMES = (
    "submit",
    "claim",
    "start",
    "heartbeat",
    "progress",
    "step",
    "suspend",
    "event",
    "wait_settle",
    "complete",
    "fail",
    "expire_claim",
    "release",
    "handler_returned",
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
    "schedule_move_out",
    "schedule_move_in",
    "batch_open",
    "batch_seal",
    "batch_purge",
    "id_reserve",
    "id_release",
    "unique_reserve",
    "unique_release",
    "debounce_join",
    "dep_link",
    "batch_join",
    "outbox_apply",
    "param_reindex",
    "index_match",
)


@functools.cache
def source(name: str) -> str:
    """The full text of one script: the shared preludes (_common.lua, _batches.lua), then the
    script itself."""
    folder = resources.files(LUA_PACKAGE).joinpath("lua")
    prelude = folder.joinpath("_common.lua").read_text(encoding="utf-8")
    prelude += folder.joinpath("_batches.lua").read_text(encoding="utf-8")
    return prelude + folder.joinpath(f"{name}.lua").read_text(encoding="utf-8")


class Scripts:
    """Every transition script registered on one client. ``run`` sends EVALSHA and loads the
    script once when the server does not know it (first use, or after a restart).

    On a plain ``redis.Redis`` client (one with a connection pool: not a Cluster client, not a
    single-connection one, no client-side cache) ``run`` writes the command itself on a
    connection it keeps: redis-py's command machinery (taking a connection from the pool and
    giving it back, its observability hooks, response callbacks: about 1,600 bytecode steps a
    call) costs several times the call itself, and the worker pays it on each claim, start and
    completion batch. Connections are taken from the client's pool and up to KEPT_CONNECTIONS
    idle ones kept here for the next calls (a forked process starts afresh). The connection's
    own retry policy still applies: a call that fails on a lost connection is sent again on a
    new one, as through redis-py (every transition script is safe to repeat: its nonce or its
    compare-and-set recognises a write already made). Other clients go through redis-py."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._scripts = {name: client.register_script(source(name)) for name in NAMES}
        self._get_connection = _pooled_connections(client)
        self._pack = _packer(client)
        self._free: list[Any] = []  # connections kept for run(), not in use now
        self._free_lock = threading.Lock()
        self._pid = os.getpid()

    def __getattr__(self, name: str) -> Any:
        try:
            return self._scripts[name]
        except KeyError:
            raise AttributeError(name) from None

    def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name`` with these keys and arguments; its reply."""
        script = self._scripts[name]
        get_connection = self._get_connection
        if get_connection is None:
            return script(keys=keys, args=args)
        with self._free_lock:
            if self._pid != os.getpid():  # forked: the parent's connections are not ours
                self._free, self._pid = [], os.getpid()
            conn = self._free.pop() if self._free else None
        if conn is None:
            conn = get_connection()
        try:
            return conn.retry.call_with_retry(
                lambda: self._call(conn, script, keys, args), lambda _error: conn.disconnect()
            )
        finally:
            with self._free_lock:
                keep = len(self._free) < KEPT_CONNECTIONS and self._pid == os.getpid()
                if keep:
                    self._free.append(conn)
            if not keep:
                self._client.connection_pool.release(conn)

    def close(self) -> None:
        """Give the kept connections back to the client's pool."""
        with self._free_lock:
            kept, self._free = self._free, []
        if self._pid == os.getpid():
            for conn in kept:
                self._client.connection_pool.release(conn)

    def _call(self, conn: Any, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        from redis.exceptions import NoScriptError

        conn.send_packed_command(self._pack(conn, ("EVALSHA", script.sha, len(keys), *keys, *args)))
        try:
            return conn.read_response()
        except NoScriptError:  # a restarted or flushed server: load it, send again
            # On this same connection: after a restart every thread of a worker meets this at
            # once, and loading through the client would take one more connection each.
            conn.send_packed_command(self._pack(conn, ("SCRIPT", "LOAD", script.script)))
            conn.read_response()  # the script's SHA1, which script.sha already is
            conn.send_packed_command(
                self._pack(conn, ("EVALSHA", script.sha, len(keys), *keys, *args))
            )
            return conn.read_response()


def _pooled_connections(client: Any) -> Callable[[], Any] | None:
    """How to take a connection from ``client``'s pool for a direct call; None when the client
    must be used through redis-py (see Scripts)."""
    try:
        from redis import Redis
    except ImportError:  # pragma: no cover - the storage needs redis
        return None
    if type(client) is not Redis or getattr(client, "connection", None) is not None:
        return None
    pool = getattr(client, "connection_pool", None)
    if pool is None or getattr(pool, "cache", None) is not None:
        return None
    get_connection = pool.get_connection
    parameter = inspect.signature(get_connection).parameters.get("command_name")
    if parameter is not None and parameter.default is inspect.Parameter.empty:
        # redis-py before 5.3 wants the command's name (and ignores it).
        return functools.partial(get_connection, "EVALSHA")
    return get_connection  # type: ignore[no-any-return]


def _packer(client: Any) -> Callable[[Any, tuple[Any, ...]], Any]:
    """Packs a command for a connection: with hiredis in one C call (our arguments are str and
    int only, which it encodes as UTF-8), else by the connection's own packer."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if str(kwargs.get("encoding", "utf-8")).lower().replace("_", "-") not in ("utf-8", "utf8"):
        return lambda conn, command: conn.pack_command(*command)
    try:
        import hiredis

        pack_command = hiredis.pack_command
    except (ImportError, AttributeError):
        return lambda conn, command: conn.pack_command(*command)
    return lambda conn, command: (pack_command(command),)
