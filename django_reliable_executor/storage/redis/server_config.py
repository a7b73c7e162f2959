"""What in a Redis server's configuration loses tasks: eviction, and persistence off or lax."""

from __future__ import annotations

from typing import Any

from .codec import text

# appendfsync values at least as strong as everysec (docs/redis.md, "Durability")
SAFE_FSYNC = frozenset({"always", "everysec"})


def _one_node(info: Any, field: str) -> dict[str, Any]:
    """INFO of one server: a Cluster client answers per node (the nodes share a configuration)."""
    if isinstance(info, dict) and field not in info:
        return next(iter(info.values()), {}) if info else {}
    return info if isinstance(info, dict) else {}


def config_warnings(
    client: Any, where: str, unavailable: tuple[type[BaseException], ...]
) -> list[str]:
    """One sentence per setting of the server at ``where`` that may lose tasks, naming the
    setting, what it loses and how to set it. A server that refuses INFO or CONFIG (a
    restricted ACL user) says nothing of what it refused; ``unavailable`` errors propagate."""
    found: list[str] = []
    try:
        memory = _one_node(client.info("memory"), "maxmemory_policy")
    except unavailable:
        raise
    except Exception:
        memory = {}
    policy = text(memory.get("maxmemory_policy", "noeviction"))
    if policy != "noeviction":
        found.append(
            f"Redis at {where} has maxmemory-policy {policy}: when memory runs short it "
            "deletes keys, and these keys are tasks. Set maxmemory-policy noeviction."
        )
    try:
        persistence = _one_node(client.info("persistence"), "aof_enabled")
    except unavailable:
        raise
    except Exception:
        return found
    if "aof_enabled" not in persistence:
        return found
    if not int(persistence["aof_enabled"]):
        found.append(
            f"Redis at {where} has appendonly no: a restart of Redis loses every task written "
            "since its last RDB snapshot (every task when snapshots are off too). Set "
            "appendonly yes with appendfsync everysec (about the last second is lost in a "
            "crash) or always (nothing acknowledged is lost): in redis.conf, and on the running "
            "server with CONFIG SET appendonly yes."
        )
        return found
    try:
        fsync = _one_node(client.config_get("appendfsync"), "appendfsync")
    except unavailable:
        raise
    except Exception:
        return found
    mode = text(fsync.get("appendfsync", "everysec"))
    if mode not in SAFE_FSYNC:
        found.append(
            f"Redis at {where} has appendfsync {mode}: the operating system decides when the "
            "AOF reaches the disk, so a crash of Redis or its machine loses the writes of up to "
            "about the last 30 seconds. Set appendfsync everysec (about the last second) or "
            "always (nothing acknowledged is lost)."
        )
    return found
