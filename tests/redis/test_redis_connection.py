"""Every way of connecting to Redis (URL, TLS, ACL user, Sentinel, Cluster, a Django cache) against
real spare servers, the settings that choose it, describe() and the Redis system checks."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import redis
import redis.cluster
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_reliable_executor.checks import check_database, check_settings
from django_reliable_executor.conf import get_settings, validate
from django_reliable_executor.storage.redis.connection import (
    HEALTH_CHECK_INTERVAL,
    SOCKET_CONNECT_TIMEOUT,
    SOCKET_TIMEOUT,
    connect,
    describe,
)

if TYPE_CHECKING:
    from tests.support.redis_servers import AclServer, RedisServer, SentinelSetup, SpareServers

# its fixtures: redis_server, redis_tls, redis_acl, …
pytest_plugins = ["tests.support.redis_servers"]

PREFIX = "{reliable_executor_conn_test}"


def configured(**settings: Any) -> override_settings:
    """override_settings(RELIABLE_EXECUTOR=...) with the Redis storage selected."""
    return override_settings(RELIABLE_EXECUTOR={"STORAGE": "redis", **settings})


@pytest.fixture
def connected() -> Iterator[list[Any]]:
    """Clients a test connects through connect(); each is closed afterwards."""
    clients: list[Any] = []
    yield clients
    for client in clients:
        client.close()


def client_for(connected: list[Any], **settings: Any) -> Any:
    with configured(**settings):
        client = connect(get_settings())
    connected.append(client)
    return client


def round_trip(client: Any, key: str = f"{PREFIX}:round-trip") -> None:
    try:
        assert client.set(key, "v1") is True
        assert client.get(key) in ("v1", b"v1")
    finally:
        client.delete(key)


# -- REDIS_URL --------------------------------------------------------------------------------
def test_plain_url_connects_with_our_defaults(redis_server: RedisServer, connected):
    client = client_for(connected, REDIS_URL=redis_server.url)
    assert isinstance(client, redis.Redis)
    round_trip(client)
    assert client.get("absent") is None
    client.set(f"{PREFIX}:text", "é")
    assert client.get(f"{PREFIX}:text") == "é"  # decode_responses=True: str, not bytes
    client.delete(f"{PREFIX}:text")
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_connect_timeout"] == SOCKET_CONNECT_TIMEOUT
    assert kwargs["socket_timeout"] == SOCKET_TIMEOUT
    assert kwargs["health_check_interval"] == HEALTH_CHECK_INTERVAL
    retry = kwargs["retry"]
    assert retry.get_retries() == 3
    assert set(retry._supported_errors) == {redis.ConnectionError, redis.TimeoutError}
    assert client.connection_pool.connection_kwargs["db"] == 0


def test_url_database_number_is_used(redis_server: RedisServer, connected):
    url = redis_server.url.rsplit("/", 1)[0] + "/3"
    client = client_for(connected, REDIS_URL=url)
    client.set(f"{PREFIX}:db", "three")
    try:
        with redis_server.client(db=3) as admin:
            assert admin.get(f"{PREFIX}:db") == "three"
        with redis_server.client(db=0) as admin:
            assert admin.get(f"{PREFIX}:db") is None
    finally:
        client.delete(f"{PREFIX}:db")


def test_redis_options_override_the_defaults(redis_server: RedisServer, connected):
    options = {"socket_timeout": 3.5, "decode_responses": False, "client_name": "executor-test"}
    client = client_for(connected, REDIS_URL=redis_server.url, REDIS_OPTIONS=options)
    client.set(f"{PREFIX}:raw", "v")
    try:
        assert client.get(f"{PREFIX}:raw") == b"v"
        assert client.client_getname() in ("executor-test", b"executor-test")
    finally:
        client.delete(f"{PREFIX}:raw")
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 3.5
    assert kwargs["socket_connect_timeout"] == SOCKET_CONNECT_TIMEOUT  # the rest stay


def test_connections_share_driver_info_read_once(redis_server: RedisServer, connected):
    """redis-py 7.1+ reads its package metadata for each new connection unless given a
    driver_info: the client's connections share one, with redis-py's own name and version."""
    from redis import driver_info
    from redis.utils import get_lib_version

    client = client_for(connected, REDIS_URL=redis_server.url)
    pool = client.connection_pool
    first, second = pool.get_connection(), pool.get_connection()
    try:
        assert first is not second
        assert isinstance(first.driver_info, driver_info.DriverInfo)
        assert first.driver_info is second.driver_info
        assert first.driver_info.lib_version == get_lib_version()
        assert first.driver_info.formatted_name == driver_info.DriverInfo().formatted_name
    finally:
        pool.release(first)
        pool.release(second)


def test_lib_name_option_is_not_overridden(redis_server: RedisServer, connected):
    client = client_for(connected, REDIS_URL=redis_server.url, REDIS_OPTIONS={"lib_name": "x"})
    assert "driver_info" not in client.connection_pool.connection_kwargs
    connection = client.connection_pool.get_connection()
    try:
        assert connection.driver_info.name == "x"
    finally:
        client.connection_pool.release(connection)


def test_unix_socket_url(redis_server: RedisServer, connected):
    client = client_for(connected, REDIS_URL=redis_server.unix_url)
    round_trip(client)
    assert client.connection_pool.connection_kwargs["path"] == str(redis_server.unix_socket)


def test_rediss_url_with_the_ca_in_redis_options(redis_tls: RedisServer, connected):
    assert redis_tls.tls is not None
    client = client_for(
        connected,
        REDIS_URL=redis_tls.url,
        REDIS_OPTIONS={"ssl_ca_certs": str(redis_tls.tls.ca_cert)},
    )
    round_trip(client)
    assert client.connection_pool.connection_class is redis.SSLConnection


def test_rediss_url_refuses_a_server_it_cannot_verify(redis_tls: RedisServer, connected):
    client = client_for(connected, REDIS_URL=redis_tls.url)  # the system CAs only
    with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
        client.ping()


def test_acl_user_and_password_in_the_url(redis_acl: AclServer, connected):
    client = client_for(connected, REDIS_URL=redis_acl.url())
    round_trip(client)
    assert client.acl_whoami() == "executor"


def test_acl_wrong_password_fails_clearly(redis_acl: AclServer, connected):
    client = client_for(connected, REDIS_URL=redis_acl.url(password="wrong"))
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"):
        client.ping()


# -- REDIS_SENTINEL ---------------------------------------------------------------------------
def sentinel_setting(setup: SentinelSetup, **extra: Any) -> dict[str, Any]:
    return {
        "sentinels": setup.sentinels,
        "service_name": setup.service_name,
        "password": setup.master.password,
        **extra,
    }


def test_sentinel_connects_to_the_master(redis_sentinel: SentinelSetup, connected):
    client = client_for(connected, REDIS_SENTINEL=sentinel_setting(redis_sentinel, db=2))
    assert isinstance(client, redis.Redis)
    round_trip(client)
    assert int(client.info("server")["tcp_port"]) == redis_sentinel.master.port
    client.set(f"{PREFIX}:sentinel", "yes")
    try:
        with redis_sentinel.master.client(db=2) as admin:
            assert admin.get(f"{PREFIX}:sentinel") == "yes"
    finally:
        client.delete(f"{PREFIX}:sentinel")


def test_sentinel_unknown_service_fails_clearly(redis_sentinel: SentinelSetup, connected):
    setting = sentinel_setting(redis_sentinel, service_name="nosuchmaster")
    client = client_for(connected, REDIS_SENTINEL=setting)
    with pytest.raises(redis.sentinel.MasterNotFoundError, match="nosuchmaster"):
        client.ping()


def test_sentinel_wrong_master_password_fails(redis_sentinel: SentinelSetup, connected):
    client = client_for(
        connected, REDIS_SENTINEL=sentinel_setting(redis_sentinel, password="wrong")
    )
    with pytest.raises(redis.AuthenticationError):
        client.ping()


# -- REDIS_CLUSTER ----------------------------------------------------------------------------
def test_cluster_through_any_one_node(redis_cluster: list[str], connected):
    client = client_for(connected, REDIS_CLUSTER=True, REDIS_URL=redis_cluster[1])
    assert isinstance(client, redis.cluster.RedisCluster)
    assert len(client.get_primaries()) == 3
    keys = [f"{PREFIX}:a", f"{PREFIX}:b"]
    try:
        round_trip(client, keys[0])
        # Hash-tagged keys share a slot, so a multi-key script may touch them (as ours do).
        script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])"
        assert client.eval(script, 2, keys[0], keys[1], "x") == 1
        assert client.get(keys[0]) == "x"
        assert client.keyslot(keys[0]) == client.keyslot(keys[1])
    finally:
        for key in keys:
            client.delete(key)
    # Keys without the tag are spread over the nodes, and still reachable.
    spread = {client.keyslot(f"k{i}") // 5462 for i in range(20)}
    assert len(spread) > 1
    for i in range(20):
        client.set(f"k{i}", i)
    assert [client.get(f"k{i}") for i in range(20)] == [str(i) for i in range(20)]
    for i in range(20):
        client.delete(f"k{i}")


def test_cluster_client_has_no_health_check_but_our_retries(redis_cluster: list[str], connected):
    client = client_for(connected, REDIS_CLUSTER=True, REDIS_URL=redis_cluster[0])
    assert client.retry.get_retries() == 3
    node = client.get_default_node()
    kwargs = node.redis_connection.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == SOCKET_TIMEOUT
    assert kwargs["decode_responses"] is True


# -- REDIS_CACHE_ALIAS ------------------------------------------------------------------------
def redis_caches(location: str) -> dict[str, Any]:
    return {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "tasks": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": location,
            "KEY_PREFIX": "conn-test",
        },
    }


def test_cache_alias_shares_the_django_redis_cache_pool(redis_server: RedisServer):
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    with (
        override_settings(CACHES=redis_caches(redis_server.url)),
        configured(REDIS_CACHE_ALIAS="tasks"),
    ):
        client = connect(get_settings())
        cache = caches["tasks"]
        assert isinstance(cache, RedisCache)
        assert isinstance(client, redis.Redis)
        assert client.connection_pool is cache._cache.get_client(write=True).connection_pool
        cache.set("shared", 42)
        try:
            key = cache.make_key("shared")
            assert client.get(key) == b"42"  # the cache's client, as is: bytes
            round_trip(client)
        finally:
            cache.delete("shared")
        assert describe(get_settings()) == f"cache 'tasks' ({redis_server.url})"
        assert check_settings() == []
        # read through the cache's client (bytes): the spare server has no persistence
        found = check_database(databases=["default"])
        assert [w.id for w in found] == ["reliable_executor.W001"], found


def test_cache_alias_of_another_backend_is_refused():
    with configured(REDIS_CACHE_ALIAS="default"):
        with pytest.raises(ImproperlyConfigured) as caught:
            connect(get_settings())
        errors = check_settings()
        assert check_database(databases=["default"]) == []  # E009 says it already
    message = str(caught.value)
    assert "'default'" in message
    assert "django.core.cache.backends.locmem.LocMemCache" in message
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E009", "REDIS_CACHE_ALIAS")]
    assert "LocMemCache" in errors[0].msg


def test_cache_alias_missing_from_caches():
    with configured(REDIS_CACHE_ALIAS="nowhere"):
        with pytest.raises(ImproperlyConfigured, match="nowhere"):
            connect(get_settings())
        errors = check_settings()
        assert check_database(databases=["default"]) == []  # E003 says it already
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E003", "REDIS_CACHE_ALIAS")]


# -- settings validation ----------------------------------------------------------------------
GOOD_SENTINEL = {"sentinels": [["10.0.0.1", 26379]], "service_name": "mymaster"}
BAD_VALUES = [
    ("REDIS_CLUSTER", "yes", "True or False"),
    ("REDIS_CLUSTER", 1, "True or False"),
    ("REDIS_CLUSTER", None, "True or False"),
    ("REDIS_SENTINEL", "mymaster", "got str"),
    ("REDIS_SENTINEL", {"service_name": "m"}, "'sentinels' is missing"),
    ("REDIS_SENTINEL", {"sentinels": [["h", 1]]}, "'service_name' is missing"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "sentinels": []}, "non-empty list"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "sentinels": "h:26379"}, "non-empty list"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "sentinels": [["h"]]}, "not a [host, port] pair"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "sentinels": [["h", "1"]]}, "not a [host, port] pair"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "sentinels": [["", 1]]}, "not a [host, port] pair"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "sentinels": [["h", 0]]}, "not a [host, port] pair"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "service_name": ""}, "'service_name' must be"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "db": -1}, "'db' must be"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "db": "0"}, "'db' must be"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "username": 5}, "'username' must be"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "sentinel_kwargs": []}, "'sentinel_kwargs' must be"),
    ("REDIS_SENTINEL", {**GOOD_SENTINEL, "master": "x"}, "unknown key 'master'"),
    ("REDIS_OPTIONS", None, "got NoneType"),
    ("REDIS_OPTIONS", [("ssl", True)], "got list"),
    ("REDIS_OPTIONS", {1: 2}, "1 is not a keyword argument name"),
    ("REDIS_OPTIONS", {"socket timeout": 2}, "is not a keyword argument name"),
]


@pytest.mark.parametrize(("key", "value", "reason"), BAD_VALUES)
def test_validation_names_the_key_and_what_is_wrong(key, value, reason):
    [(problem_key, message)] = validate({key: value})
    assert problem_key == key
    assert f"RELIABLE_EXECUTOR[{key!r}]" in message
    assert "expected" in message
    assert reason in message


@pytest.mark.parametrize("key", ["REDIS_CLUSTER", "REDIS_SENTINEL", "REDIS_OPTIONS"])
def test_system_check_names_each_new_key(key):
    bad = {"REDIS_CLUSTER": "yes", "REDIS_SENTINEL": [], "REDIS_OPTIONS": "ssl=true"}[key]
    with override_settings(RELIABLE_EXECUTOR={key: bad}):
        errors = check_settings()
        with pytest.raises(ImproperlyConfigured, match=key):
            get_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E001", key)]


def test_good_values_of_the_new_keys():
    assert validate({"REDIS_CLUSTER": True, "REDIS_URL": "rediss://:pw@node1:7000"}) == []
    full = {
        "sentinels": [("10.0.0.1", 26379), ["sentinel-2.internal", 26380]],
        "service_name": "mymaster",
        "db": 1,
        "password": "secret",
        "username": None,
        "sentinel_kwargs": {"password": "sentinel-secret"},
    }
    assert validate({"REDIS_SENTINEL": full}) == []
    assert validate({"REDIS_SENTINEL": None, "REDIS_OPTIONS": {}}) == []
    assert validate({"REDIS_OPTIONS": {"ssl_ca_certs": "/etc/ca.pem", "max_connections": 50}}) == []


@pytest.mark.parametrize(
    ("settings", "key", "text"),
    [
        ({"REDIS_CLUSTER": True, "REDIS_SENTINEL": GOOD_SENTINEL}, "REDIS_CLUSTER", "Sentinel"),
        ({"REDIS_CACHE_ALIAS": "c", "REDIS_SENTINEL": GOOD_SENTINEL}, "REDIS_CACHE_ALIAS", ""),
        ({"REDIS_CACHE_ALIAS": "c", "REDIS_CLUSTER": True}, "REDIS_CACHE_ALIAS", ""),
        ({"REDIS_CLUSTER": True, "REDIS_URL": "unix:///run/redis.sock"}, "REDIS_URL", "any one"),
        ({"REDIS_CLUSTER": True, "REDIS_URL": "redis://node:7000/3"}, "REDIS_URL", "database 0"),
    ],
)
def test_keys_that_do_not_go_together(settings, key, text):
    [(problem_key, message)] = validate(settings)
    assert problem_key == key
    assert f"RELIABLE_EXECUTOR[{key!r}]" in message
    assert text in message


def test_messages_never_show_passwords():
    sentinel = {**GOOD_SENTINEL, "password": "hunter2", "db": -1}
    sentinel_kwargs = {**GOOD_SENTINEL, "sentinel_kwargs": {"password": "hunter2"}, "x": 1}
    cluster_url = "redis://user:hunter2@node:7000/3"
    for settings in (
        {"REDIS_SENTINEL": sentinel},
        {"REDIS_SENTINEL": sentinel_kwargs},
        {"REDIS_OPTIONS": {"ssl_password": "hunter2", 3: 4}},
        {"REDIS_CLUSTER": True, "REDIS_URL": cluster_url},
        {"REDIS_URL": "http://:hunter2@host"},
    ):
        [(_, message)] = validate(settings)
        assert "hunter2" not in message
        assert "***" in message


def test_get_settings_normalises_and_copies_the_dicts():
    sentinel = {"sentinels": [["10.0.0.1", 26379]], "service_name": "mymaster"}
    options = {"socket_timeout": 3}
    with configured(REDIS_SENTINEL=sentinel, REDIS_OPTIONS=options):
        current = get_settings()
        sentinel["service_name"] = "changed"
        options["socket_timeout"] = 99
        assert current.REDIS_SENTINEL == {
            "sentinels": [("10.0.0.1", 26379)],
            "service_name": "mymaster",
            "db": 0,
            "password": None,
            "username": None,
            "sentinel_kwargs": {},
        }
        assert current.REDIS_OPTIONS == {"socket_timeout": 3}
        assert hash(current) == hash(current)  # still hashable: the dicts are left out
    assert get_settings().REDIS_OPTIONS == {}
    assert get_settings().REDIS_SENTINEL is None
    assert get_settings().REDIS_CLUSTER is False


# -- describe() -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("settings", "described"),
    [
        ({}, "redis://127.0.0.1:6379/0"),
        ({"REDIS_URL": "redis://:s3cret@127.0.0.1:6379/0"}, "redis://:***@127.0.0.1:6379/0"),
        (
            {"REDIS_URL": "rediss://app:s3cret@cache.internal:6380/2"},
            "rediss://app:***@cache.internal:6380/2",
        ),
        ({"REDIS_URL": "redis://app@host:6379/0"}, "redis://app@host:6379/0"),
        (
            {"REDIS_URL": "unix:///run/redis.sock?db=1&password=s3cret"},
            "unix:///run/redis.sock?db=1&password=***",
        ),
        (
            {"REDIS_CLUSTER": True, "REDIS_URL": "redis://:s3cret@node1:7000"},
            "cluster via redis://:***@node1:7000",
        ),
        (
            {
                "REDIS_SENTINEL": {
                    "sentinels": [["10.0.0.1", 26379], ["10.0.0.2", 26379]],
                    "service_name": "mymaster",
                    "password": "s3cret",
                }
            },
            "sentinel mymaster via 10.0.0.1:26379, 10.0.0.2:26379",
        ),
        ({"REDIS_CACHE_ALIAS": "default"}, "cache 'default'"),  # LocMem: no LOCATION URL
    ],
)
def test_describe_masks_passwords(settings, described):
    with configured(**settings):
        assert describe(get_settings()) == described


# -- system checks ----------------------------------------------------------------------------
def test_redis_storage_passes_the_checks_when_redis_answers(redis_server: RedisServer):
    with configured(REDIS_URL=redis_server.url):
        assert check_settings() == []
        # the session's spare server runs without persistence: a warning, no error
        found = check_database(databases=["default"])
        assert [w.id for w in found] == ["reliable_executor.W001"], found


def test_e005_redis_package_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)  # how Python spells "cannot be imported"
    with configured():
        errors = check_settings()
        assert check_database(databases=["default"]) == []  # E005 says it already
        with pytest.raises(ImproperlyConfigured, match=r"django-reliable-executor\[redis\]"):
            connect(get_settings())
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E005", "STORAGE")]
    assert "not installed" in errors[0].msg
    assert errors[0].hint == "pip install django-reliable-executor[redis]"


def test_e005_not_raised_for_the_database_storage(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)
    assert check_settings() == []


def test_w002_redis_cannot_be_reached(spare_redis: SpareServers):
    gone = spare_redis(password="s3cret")
    gone.stop()  # nothing listens on its port any more
    url = f"redis://:s3cret@127.0.0.1:{gone.port}/0"
    with configured(REDIS_URL=url):
        assert check_database() == []  # only with --database, like the database check
        errors = check_database(databases=["default"])
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.W002", "STORAGE")]
    assert errors[0].msg.startswith(
        f"Redis at redis://:***@127.0.0.1:{gone.port}/0 cannot be reached: ConnectionError: "
    )
    assert "Connection refused" in errors[0].msg
    assert "s3cret" not in errors[0].msg


def test_w002_wrong_acl_password(redis_acl: AclServer):
    with configured(REDIS_URL=redis_acl.url(password="not-the-password")):
        [error] = check_database(databases=["default"])
    assert error.id == "reliable_executor.W002"
    assert "AuthenticationError: invalid username-password pair" in error.msg
    assert "not-the-password" not in error.msg
    assert "executor:***@" in error.msg


def test_w002_through_sentinel(redis_sentinel: SentinelSetup):
    setting = sentinel_setting(redis_sentinel, service_name="nosuchmaster")
    with configured(REDIS_SENTINEL=setting):
        [error] = check_database(databases=["default"])
    assert error.id == "reliable_executor.W002"
    assert "sentinel nosuchmaster via 127.0.0.1:" in error.msg


def test_cluster_passes_the_database_check(redis_cluster: list[str]):
    with configured(REDIS_CLUSTER=True, REDIS_URL=redis_cluster[2]):
        found = check_database(databases=["default"])
        assert {w.id for w in found} <= {"reliable_executor.W001"}, found  # no error


# -- the spare servers themselves -------------------------------------------------------------
def test_spare_server_keeps_its_aof_across_a_crash(spare_redis: SpareServers):
    server = spare_redis("--appendonly", "yes", "--appendfsync", "always")
    with server.client() as client:
        client.set(f"{PREFIX}:durable", "kept")
    port = server.port
    server.restart(hard=True)  # SIGKILL: only what the AOF already holds survives
    assert server.port == port
    with server.client() as client:
        assert client.get(f"{PREFIX}:durable") == "kept"
    assert (server.directory / "appendonlydir").is_dir()
