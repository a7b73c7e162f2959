"""A Cluster the tests started, seen from outside: which master serves a key or slot, its
replica, the replication offsets, and failing a master over (manual or forced) then killing it
or putting it to sleep. tests/support/redis_servers.py starts the nodes."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from typing import TYPE_CHECKING, Any

import redis

from tests.support.redis_servers import CLUSTER_TIMEOUT, wait_until

if TYPE_CHECKING:
    from tests.support.redis_servers import RedisServer


@dataclasses.dataclass(frozen=True)
class Failover:
    """What :meth:`Cluster.fail_over` did: which node took over from which, and the sync point.

    ``offset_before`` is the old master's replication offset read at ``offset_at``, as the
    failover began: every write it acknowledged before ``offset_at`` is at or below it.
    ``sync_offset`` is where the new master's copy of the old history ends (its
    ``second_repl_offset`` - 1): what the new master holds of the old one. A manual failover
    makes the replica catch up with the paused master first, and a forced one here starts once
    the replica has caught up with ``offset_before``, so ``offset_before <= sync_offset``
    either way: the sync point."""

    old: RedisServer
    new: RedisServer
    slots: tuple[int, ...] = dataclasses.field(repr=False)
    offset_before: int
    sync_offset: int
    offset_at: float  # time.time() just before offset_before was read: the failover's start
    switched_at: float  # time.time() when every live node served the slots from the new master
    down_at: float  # time.time() when the old master no longer answered


class Cluster:
    """A Cluster the tests started (``nodes``: masters and replicas), and how to find the master
    of a key, its replica, and fail it over. Topology is asked of the live nodes each time, so
    it stays right after a failover."""

    def __init__(self, nodes: list[RedisServer]) -> None:
        self.nodes = nodes

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def live(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.running]

    def by_port(self, port: int) -> RedisServer:
        return next(node for node in self.nodes if node.port == port)

    def node_id(self, node: RedisServer) -> str:
        with node.client() as admin:
            return str(admin.execute_command("CLUSTER", "MYID"))

    def slot_of(self, key: str) -> int:
        """CLUSTER KEYSLOT of ``key`` (a hash tag is honoured)."""
        with self.live[0].client() as admin:
            return int(admin.execute_command("CLUSTER", "KEYSLOT", key))

    def slot_owners(self, node: RedisServer | None = None) -> dict[int, int]:
        """Slot -> port of its master, as ``node`` (default: the first live one) sees it."""
        with (node or self.live[0]).client() as admin:
            ranges = admin.execute_command("CLUSTER", "SLOTS")
        owners = {}
        for start, end, master, *_replicas in ranges:
            for slot in range(int(start), int(end) + 1):
                owners[slot] = int(master[1])
        return owners

    def masters(self) -> list[RedisServer]:
        """The live nodes that serve slots, as the first live node sees it."""
        ports = sorted(set(self.slot_owners().values()))
        return [self.by_port(port) for port in ports]

    def master_of_slot(self, slot: int) -> RedisServer:
        """The master serving ``slot``."""
        return self.by_port(self.slot_owners()[slot])

    def master_of(self, key: str) -> RedisServer:
        """The master serving ``key``'s slot."""
        return self.master_of_slot(self.slot_of(key))

    def replica_of(self, master: RedisServer) -> RedisServer:
        """A live, in-sync replica of ``master`` (CLUSTER REPLICAS, asked of the master)."""
        with master.client() as admin:
            lines = admin.execute_command("CLUSTER", "REPLICAS", self.node_id(master))
        for line in lines:
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            flags = fields[2].split(",")
            replica = self.by_port(port)
            if "fail" not in flags and "fail?" not in flags and replica.running:
                return replica
        raise LookupError(f"{master} has no live replica")

    @staticmethod
    def replication(node: RedisServer) -> dict[str, Any]:
        with node.client() as admin:
            return dict(admin.info("replication"))

    def replicated_offset(self, master: RedisServer) -> int:
        """Wait until every replica of ``master`` has its whole stream as of now, and return that
        offset: every write the master acknowledged before this call is on its replicas."""
        offset = int(self.replication(master)["master_repl_offset"])

        def caught_up() -> bool:
            info = self.replication(master)
            replicas = [value for key, value in info.items() if key.startswith("slave")]
            replicas = [value for value in replicas if isinstance(value, dict)]
            return bool(replicas) and all(int(r["offset"]) >= offset for r in replicas)

        wait_until(caught_up, CLUSTER_TIMEOUT, f"replicas of {master} reaching offset {offset}")
        return offset

    def settled(self) -> bool:
        """Every live node reports cluster_state:ok, knows every node, agrees on who serves
        each slot, and every live replica's link to its master is up."""
        views = []
        for node in self.live:
            with node.client() as admin:
                info = admin.cluster("INFO")
                role = admin.execute_command("ROLE")[0]
                replication = admin.info("replication")
            if info.get("cluster_state") != "ok":
                return False
            if int(info.get("cluster_known_nodes", 0)) != len(self.nodes):
                return False
            if role == "slave" and replication.get("master_link_status") != "up":
                return False
            views.append(self.slot_owners(node))
        return bool(views) and all(view == views[0] for view in views) and len(views[0]) == 16384

    def fail_over(
        self,
        master: RedisServer,
        *,
        then: str = "kill",
        force: bool = False,
        sleep_seconds: float = 10.0,
    ) -> Failover:
        """Fail ``master`` over to its replica the way an operator does, and take the old master
        away: SIGKILL (``then="kill"``) or ``DEBUG SLEEP sleep_seconds`` (``then="sleep"``: it
        holds every connection unanswered meanwhile, as a hung machine does).

        Without ``force``: ``CLUSTER FAILOVER`` on the replica (a manual failover: the master
        pauses its writers, the replica catches up with it, then takes its slots), then, once
        every live node serves those slots from the replica, the old master is taken away.
        With ``force``: the master is taken away first (a crash), once its replicas have the
        whole stream as of ``offset_before``; then ``CLUSTER FAILOVER FORCE`` on the replica,
        which takes over without the master (what a Cluster does by itself after
        ``cluster-node-timeout``, sooner). Returns when every other live node serves the slots
        from the replica."""
        if then not in ("kill", "sleep"):
            raise ValueError(f"then={then!r}: 'kill' or 'sleep'")
        replica = self.replica_of(master)
        slots = tuple(slot for slot, port in self.slot_owners().items() if port == master.port)
        offset_at = time.time()
        if force:
            offset_before = self.replicated_offset(master)
            down_at = self._take_down(master, then, sleep_seconds)
        else:
            offset_before = int(self.replication(master)["master_repl_offset"])
        with replica.client() as admin:
            admin.execute_command("CLUSTER", "FAILOVER", *(["FORCE"] if force else []))
        others = [node for node in self.live if node is not master]

        def switched() -> bool:
            return all(self.slot_owners(node)[slots[0]] == replica.port for node in others)

        wait_until(switched, CLUSTER_TIMEOUT, f"{replica} taking over from {master}")
        switched_at = time.time()
        sync_offset = int(self.replication(replica)["second_repl_offset"]) - 1
        if not force:
            down_at = self._take_down(master, then, sleep_seconds)
        return Failover(
            old=master,
            new=replica,
            slots=slots,
            offset_before=offset_before,
            sync_offset=sync_offset,
            offset_at=offset_at,
            switched_at=switched_at,
            down_at=down_at,
        )

    def heal(self) -> None:
        """Start every node that is not running again (same port and directory: a killed
        master rejoins as a replica of the node that replaced it), and wait until the Cluster
        has settled, every master again with a replica in sync."""
        for node in self.nodes:
            if not node.running:
                node.start()
        wait_until(self.settled, CLUSTER_TIMEOUT, "the healed Cluster to settle")

    @staticmethod
    def _take_down(node: RedisServer, then: str, sleep_seconds: float) -> float:
        """Kill ``node`` or put it to sleep; time.time() once it no longer answers."""
        if then == "kill":
            node.kill()
        else:
            sleeper = threading.Thread(target=_debug_sleep, args=(node, sleep_seconds), daemon=True)
            sleeper.start()
            # DEBUG SLEEP blocks the server as soon as it reads the command: wait for that
            wait_until(lambda: not _answers_quickly(node), 5, f"{node} to fall asleep")
        return time.time()


def _debug_sleep(node: RedisServer, seconds: float) -> None:
    with contextlib.suppress(redis.RedisError), node.client(socket_timeout=seconds + 10) as admin:
        admin.execute_command("DEBUG", "SLEEP", seconds)


def _answers_quickly(node: RedisServer) -> bool:
    try:
        with node.client(socket_timeout=0.2, socket_connect_timeout=0.2, retry=None) as admin:
            return bool(admin.ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
