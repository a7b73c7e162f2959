"""Throw-away redis-server processes (plain, TLS, ACL, Sentinel, Cluster, a Cluster with
replicas to fail over) and their fixtures.

Every server runs in a directory of its own under pytest's tmp dir, binds 127.0.0.1 on a port
picked here, and is killed at teardown (and, on Linux, when the test run itself dies). The shared
server on 127.0.0.1:6379 is never touched. Without ``redis-server`` on PATH (or ``redis-cli`` for
the Cluster, ``openssl`` and a TLS build for TLS) the tests using these fixtures skip locally and
fail under CI (CI=true), like an unreachable database.

Use the fixtures by naming this module as a plugin in a test module (or in conftest.py)::

    pytest_plugins = ["tests.support.redis_servers"]
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import redis

from tests.support.ci import IN_CI

if TYPE_CHECKING:
    from tests.support.redis_clusters import Cluster

T = TypeVar("T")
HOST = "127.0.0.1"
START_TIMEOUT = 10.0  # seconds for one server to answer PING
CLUSTER_TIMEOUT = 30.0  # seconds for a new Cluster to report cluster_state:ok on every node
# How long a Cluster node may not answer before the others mark it failing (ms). A manual
# failover (CLUSTER FAILOVER) does not wait for it; only the detection of a dead node does.
CLUSTER_NODE_TIMEOUT_MS = 5000
SHARED_PORT = 6379  # the developer's / CI's shared server: never a port of ours

_running: set[subprocess.Popen[bytes]] = set()


class ServerUnavailable(Exception):
    """The tool or feature a fixture needs is missing (no redis-server, a build without TLS)."""


class ServerExited(RuntimeError):
    """redis-server exited while starting (the message holds its log)."""


def require_tool(name: str) -> str:
    """The path of a command-line tool; skip locally, fail under CI, when it is not on PATH."""
    path = shutil.which(name)
    if path is None:
        _unavailable(f"{name} is not on PATH")
    assert path is not None
    return path


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (needed under CI=true)", pytrace=False)
    pytest.skip(f"{reason} (runs under CI=true)")


def wait_until(predicate: Callable[[], T], timeout: float, message: str) -> T:
    """Poll ``predicate`` until it returns something truthy and return that, or raise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s: {message}")
        time.sleep(0.05)


def free_port(*, with_bus: bool = False) -> int:
    """A TCP port nothing listens on now (and, ``with_bus``, port + 10000 too: the Cluster bus).

    Random in 20000-54999 rather than the kernel's ephemeral range, so client sockets do not
    take it in the meantime; a start that still loses the race is retried on another port."""
    for _ in range(200):
        port = random.randrange(20000, 55000)
        if port == SHARED_PORT:
            continue
        if _bindable(port) and (not with_bus or _bindable(port + 10000)):
            return port
    raise RuntimeError("no free port found")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((HOST, port))
        except OSError:
            return False
    return True


@functools.cache
def debug_command_args() -> list[str]:
    """The option that lets a local client send DEBUG: Redis 7 refuses DEBUG by default, and
    Redis 6 does not know the option (and allows DEBUG)."""
    version = subprocess.run(
        [require_tool("redis-server"), "--version"], capture_output=True, text=True, timeout=10
    ).stdout
    found = re.search(r"v=(\d+)\.", version)
    if found is None or int(found.group(1)) < 7:
        return []
    return ["--enable-debug-command", "local"]


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGKILL when the test run dies, so no server
    outlives an interrupted pytest."""
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_running):
        with contextlib.suppress(OSError):
            process.kill()


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA and a server certificate it signed, for localhost and 127.0.0.1."""

    ca_cert: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate a self-signed CA and a server certificate with the ``openssl`` CLI."""
    openssl = require_tool("openssl")
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = directory / "ca.key", directory / "ca.crt"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.crt"
    extensions = directory / "server.ext"
    extensions.write_text(
        "subjectAltName = DNS:localhost, IP:127.0.0.1\n"
        "basicConstraints = critical, CA:FALSE\n"
        "keyUsage = critical, digitalSignature, keyEncipherment\n"
        "extendedKeyUsage = serverAuth\n"
        "subjectKeyIdentifier = hash\n"
        "authorityKeyIdentifier = keyid, issuer\n"
    )
    commands = [
        # The CA: self-signed, marked as a CA (Python's ssl refuses issuers that are not).
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
        + ["-keyout", ca_key, "-out", ca_cert, "-subj", "/CN=reliable-executor test CA"]
        + ["-addext", "basicConstraints=critical,CA:TRUE"]
        + ["-addext", "keyUsage=critical,keyCertSign,cRLSign"],
        [openssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr]
        + ["-subj", "/CN=localhost"],
        [openssl, "x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key]
        + ["-CAcreateserial", "-days", "2", "-out", cert, "-extfile", extensions],
    ]
    for command in commands:
        subprocess.run([str(part) for part in command], check=True, capture_output=True, timeout=60)
    return TlsFiles(ca_cert=ca_cert, cert=cert, key=key)


class RedisServer:
    """One redis-server process in its own directory, on a port of its own.

    ``stop()`` and ``start()`` keep the directory, port and arguments, so the data it persisted
    (``--appendonly yes``) is there after a restart. ``client()`` is an admin connection with
    the server's own credentials; the tests build their clients from ``url`` instead."""

    def __init__(
        self,
        directory: Path,
        args: Sequence[str] = (),
        *,
        password: str | None = None,
        tls: TlsFiles | None = None,
        config_file: Path | None = None,
        with_bus: bool = False,
        unix_socket: bool = False,
    ) -> None:
        self.directory = directory
        self.args = [str(arg) for arg in args]
        self.password = password
        self.tls = tls
        self.config_file = config_file
        self.with_bus = with_bus
        self.unix_socket: Path | None = None
        if unix_socket:
            self.unix_socket = directory / "redis.sock"
            if len(str(self.unix_socket)) > 100:  # sun_path holds 104-108 bytes
                self.unix_socket = Path(tempfile.mkdtemp(prefix="re-redis-")) / "redis.sock"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    host = HOST

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (``rediss://`` with TLS), without credentials."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{self.host}:{self.port}/0"

    @property
    def unix_url(self) -> str:
        if self.unix_socket is None:
            raise ValueError("started without unix_socket=True")
        return f"unix://{self.unix_socket}?db=0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command_line(self) -> list[str]:
        command = [require_tool("redis-server")]
        if self.config_file is not None:
            command.append(str(self.config_file))
        if self.tls is not None:
            command += ["--port", "0", "--tls-port", str(self.port)]
            command += ["--tls-cert-file", str(self.tls.cert)]
            command += ["--tls-key-file", str(self.tls.key)]
            command += ["--tls-ca-cert-file", str(self.tls.ca_cert)]
            command += ["--tls-auth-clients", "no"]
        else:
            command += ["--port", str(self.port)]
        command += ["--bind", self.host, "--dir", str(self.directory)]
        command += ["--logfile", str(self.directory / "redis.log")]
        if self.config_file is None:  # a Sentinel refuses the data-server directives
            command += ["--save", "", "--appendonly", "no"]
        if self.unix_socket is not None:
            command += ["--unixsocket", str(self.unix_socket), "--unixsocketperm", "700"]
        if self.password is not None:
            command += ["--requirepass", self.password]
        return command + self.args

    def start(self) -> RedisServer:
        """Start (or start again, on the same port and directory) and wait for PING."""
        if self.running:
            return self
        first_start = self.port == 0
        for _attempt in range(5 if first_start else 1):
            if first_start:
                self.port = free_port(with_bus=self.with_bus)
            output = (self.directory / "stdout.log").open("ab")
            self.process = subprocess.Popen(
                self.command_line(),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            output.close()
            _running.add(self.process)
            try:
                wait_until(self._answers, START_TIMEOUT, f"redis-server on port {self.port}")
                return self
            except (TimeoutError, ServerExited, ServerUnavailable):
                self.kill()
                if not (first_start and "Address already in use" in self.log(lines=5)):
                    raise
        raise ServerExited(f"redis-server could not start:\n{self.log()}")

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            log = self.log()
            if self.tls is not None and "tls-port" in log:
                raise ServerUnavailable(f"this redis-server has no TLS support:\n{log}")
            raise ServerExited(f"redis-server exited ({self.process.returncode}):\n{log}")
        try:
            with self.client(socket_timeout=1, socket_connect_timeout=0.2, retry=None) as admin:
                return bool(admin.ping())
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return False

    def client(self, **kwargs: Any) -> redis.Redis:
        """An admin client of this server (its password, TLS CA), decoding responses."""
        options: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "password": self.password,
            "decode_responses": True,
            "socket_timeout": 10,
        }
        if self.tls is not None:
            options.update(ssl=True, ssl_ca_certs=str(self.tls.ca_cert))
        return redis.Redis(**{**options, **kwargs})

    def stop(self, *, hard: bool = False) -> None:
        """SIGTERM and wait (Redis flushes its AOF and exits cleanly), or SIGKILL with
        ``hard=True`` (a crash: only what ``--appendfsync`` already wrote survives)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            if hard:
                self.process.kill()
            else:
                self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        _running.discard(self.process)
        self.process = None

    def kill(self) -> None:
        self.stop(hard=True)

    def restart(self, *, hard: bool = False) -> RedisServer:
        """Stop and start again on the same port with the same data directory."""
        self.stop(hard=hard)
        return self.start()

    def log(self, lines: int = 40) -> str:
        """The last lines of the server's log file and of its early (pre-log file) output."""
        text = ""
        for name in ("stdout.log", "redis.log"):
            path = self.directory / name
            if path.exists():
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    @contextlib.contextmanager
    def monitored(self, each: Callable[[dict[str, Any]], None]) -> Iterator[None]:
        """Pass ``each`` line of the server's MONITOR (a dict, its ``command`` the words as one
        string) of every command run meanwhile; on leaving, every line up to then was passed."""
        done = f"monitor-done-{uuid.uuid4().hex}"
        listening = threading.Event()

        def listen() -> None:
            with self.client().monitor() as monitor:
                listening.set()
                for line in monitor.listen():
                    if done in line["command"].split():
                        return
                    each(line)

        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        assert listening.wait(10)
        try:
            yield
        finally:
            with self.client() as admin:
                admin.echo(done)  # MONITOR lines come in order: every earlier one was passed
            thread.join(10)
            assert not thread.is_alive()

    def __repr__(self) -> str:
        return f"<RedisServer {self.url} in {self.directory}>"


@dataclasses.dataclass
class AclServer:
    """A server whose default user has a password, plus one ACL user for the tests."""

    server: RedisServer
    username: str
    password: str

    def url(self, password: str | None = None) -> str:
        """``redis://user:password@127.0.0.1:<port>/0`` (another password to test a wrong one)."""
        secret = self.password if password is None else password
        return f"redis://{self.username}:{secret}@{self.server.host}:{self.server.port}/0"


@dataclasses.dataclass
class SentinelSetup:
    """One Sentinel monitoring one master under ``service_name``."""

    sentinel: RedisServer
    master: RedisServer
    service_name: str

    @property
    def sentinels(self) -> list[list[Any]]:
        """The ``sentinels`` value of a REDIS_SENTINEL setting."""
        return [[self.sentinel.host, self.sentinel.port]]


class SpareServers:
    """Starts servers under one directory and stops all of them in ``stop_all()``.

    Calling it starts a plain server: ``spare("--appendonly", "yes", "--appendfsync", "always")``.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.servers: list[RedisServer] = []
        self._names = 0

    def _directory(self, kind: str) -> Path:
        self._names += 1
        return self.root / f"{kind}{self._names}"

    def _start(self, server: RedisServer) -> RedisServer:
        self.servers.append(server)
        try:
            return server.start()
        except ServerUnavailable as exc:
            _unavailable(str(exc))
            raise

    def __call__(
        self, *args: str, password: str | None = None, unix_socket: bool = False
    ) -> RedisServer:
        """A plain server; ``args`` are extra redis-server options (``"--appendonly", "yes"``)."""
        require_tool("redis-server")
        return self._start(
            RedisServer(self._directory("plain"), args, password=password, unix_socket=unix_socket)
        )

    def tls(self, *args: str) -> RedisServer:
        """A server that speaks only TLS, its certificate signed by ``server.tls.ca_cert``."""
        require_tool("redis-server")
        directory = self._directory("tls")
        files = make_tls_files(directory / "certs")
        return self._start(RedisServer(directory, args, tls=files))

    def acl(
        self,
        username: str = "executor",
        password: str = "executor-secret",
        rules: Sequence[str] = ("~*", "&*", "+@all"),
    ) -> AclServer:
        """A server with ACL user ``username`` (set by --user at start: no ACL change is made
        on a running server); its default user needs the password ``admin-secret``."""
        require_tool("redis-server")
        user = ["--user", username, "on", f">{password}", *rules]
        server = RedisServer(self._directory("acl"), user, password="admin-secret")
        return AclServer(self._start(server), username, password)

    def sentinel(
        self, master: RedisServer | None = None, service_name: str = "mymaster"
    ) -> SentinelSetup:
        """A Sentinel monitoring ``master`` (a new plain server if None), ready once it sees
        the master up."""
        require_tool("redis-server")
        if master is None:
            master = self()
        directory = self._directory("sentinel")
        directory.mkdir(parents=True)
        config = directory / "sentinel.conf"  # Sentinel rewrites it: it must be writable
        lines = [
            f"sentinel monitor {service_name} {master.host} {master.port} 1",
            f"sentinel down-after-milliseconds {service_name} 2000",
            f"sentinel failover-timeout {service_name} 10000",
        ]
        if master.password is not None:
            lines.append(f"sentinel auth-pass {service_name} {master.password}")
        config.write_text("\n".join(lines) + "\n")
        sentinel = self._start(RedisServer(directory, ["--sentinel"], config_file=config))

        def master_seen() -> bool:
            with sentinel.client() as client:
                state = client.sentinel_master(service_name)
            return bool(state["is_master"] and not state["is_sdown"] and not state["is_odown"])

        wait_until(master_seen, START_TIMEOUT, f"sentinel seeing master {service_name}")
        return SentinelSetup(sentinel, master, service_name)

    def cluster(self, masters: int = 3) -> list[RedisServer]:
        """A Cluster of ``masters`` nodes without replicas, every slot assigned, ready once
        every node reports cluster_state:ok and knows every other node."""
        return self.replicated_cluster(masters, replicas=0).nodes

    def replicated_cluster(self, masters: int = 3, replicas: int = 1) -> Cluster:
        """A Cluster of ``masters`` masters with ``replicas`` replicas each (every slot
        assigned), ready once every node reports cluster_state:ok, knows every other node,
        and every replica has finished its first sync. ``.nodes`` lists every node."""
        require_tool("redis-server")
        cli = require_tool("redis-cli")
        nodes = []
        for _ in range(masters * (1 + replicas)):
            directory = self._directory("cluster")
            args = ["--cluster-enabled", "yes"]
            args += ["--cluster-config-file", str(directory / "nodes.conf")]
            args += ["--cluster-node-timeout", str(CLUSTER_NODE_TIMEOUT_MS)]
            args += debug_command_args()  # fail_over(then="sleep") sends DEBUG SLEEP
            nodes.append(self._start(RedisServer(directory, args, with_bus=True)))
        # redis-cli makes the first ``masters`` nodes masters and gives each the next ones as
        # replicas (on one host it cannot spread them over machines, and says so).
        create = [cli, "--cluster", "create", *(f"{n.host}:{n.port}" for n in nodes)]
        create += ["--cluster-replicas", str(replicas), "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=CLUSTER_TIMEOUT)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{done.stdout}{done.stderr}")
        from tests.support.redis_clusters import Cluster  # it builds on this module

        cluster = Cluster(nodes)
        wait_until(cluster.settled, CLUSTER_TIMEOUT, "cluster_state:ok on every node")
        return cluster

    def stop_all(self) -> None:
        for server in self.servers:
            server.kill()
            socket_path = server.unix_socket
            if socket_path is not None and not socket_path.is_relative_to(server.directory):
                shutil.rmtree(socket_path.parent, ignore_errors=True)  # a short-path fallback


# -- fixtures ---------------------------------------------------------------------------------
@pytest.fixture
def spare_redis(tmp_path: Path) -> Iterator[SpareServers]:
    """Per test: a SpareServers factory; every server it started is killed after the test.
    For servers a test stops, restarts or breaks."""
    spare = SpareServers(tmp_path / "redis")
    yield spare
    spare.stop_all()


@pytest.fixture(scope="session")
def spare_redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpareServers]:
    """Per run: a SpareServers factory for servers the tests share (the fixtures below)."""
    spare = SpareServers(tmp_path_factory.mktemp("redis"))
    yield spare
    spare.stop_all()


@pytest.fixture(scope="session")
def redis_server(spare_redis_session: SpareServers) -> RedisServer:
    """A plain spare server (with a unix socket too), shared by the session: use key prefixes
    of your own on it, or a fresh server from ``spare_redis`` for anything destructive."""
    return spare_redis_session(unix_socket=True)


@pytest.fixture(scope="session")
def redis_tls(spare_redis_session: SpareServers) -> RedisServer:
    """A TLS-only server; ``.url`` is ``rediss://…``, ``.tls.ca_cert`` the CA to trust."""
    return spare_redis_session.tls()


@pytest.fixture(scope="session")
def redis_acl(spare_redis_session: SpareServers) -> AclServer:
    """A server with ACL user ``executor``; ``.url()`` holds its credentials."""
    return spare_redis_session.acl()


@pytest.fixture(scope="session")
def redis_sentinel(spare_redis_session: SpareServers) -> SentinelSetup:
    """A Sentinel watching a password-protected master as ``mymaster``."""
    master = spare_redis_session(password="master-secret")
    return spare_redis_session.sentinel(master, "mymaster")


@pytest.fixture(scope="session")
def redis_cluster_nodes(spare_redis_session: SpareServers) -> list[RedisServer]:
    """The three master nodes of a spare Cluster (every slot assigned, cluster_state:ok)."""
    return spare_redis_session.cluster(3)


@pytest.fixture(scope="session")
def redis_cluster(redis_cluster_nodes: list[RedisServer]) -> list[str]:
    """The ``redis://127.0.0.1:<port>/0`` URLs of the spare Cluster's three masters."""
    return [node.url for node in redis_cluster_nodes]


@pytest.fixture(scope="session")
def _replicated_cluster(spare_redis_session: SpareServers) -> Cluster:
    return spare_redis_session.replicated_cluster(3, replicas=1)


@pytest.fixture
def redis_replicated_cluster(_replicated_cluster: Cluster) -> Iterator[Cluster]:
    """A spare Cluster of 3 masters with 1 replica each (6 servers, shared by the session),
    healed after each test (nodes it killed restarted, rejoining as replicas): for tests that
    fail a master over or kill nodes. Use key prefixes of your own on it."""
    yield _replicated_cluster
    _replicated_cluster.heal()
