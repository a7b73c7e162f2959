"""How the Redis storage connects: one redis-py client built from the RELIABLE_EXECUTOR settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from ...conf import mask_url

if TYPE_CHECKING:
    import redis
    import redis.cluster

    from ...conf import ExecutorSettings

INSTALL_HINT = "pip install django-reliable-executor[redis]"

# Defaults for the clients built here; REDIS_OPTIONS overrides each of them.
# socket_timeout bounds every read, so it must stay above the longest blocking pop the storage
# issues (1-5 s): a shorter one would turn an idle worker's wait into a TimeoutError.
SOCKET_CONNECT_TIMEOUT = 5.0
SOCKET_TIMEOUT = 10.0
# Seconds a pooled connection may sit idle before it is PINGed on its next use: a connection
# cut by a firewall or a Redis restart is replaced before a command is lost on it.
HEALTH_CHECK_INTERVAL = 30
RETRIES = 3


def require_redis() -> None:
    """Raise ImproperlyConfigured, telling what to install, when redis-py cannot be imported."""
    try:
        import redis  # noqa: F401
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"STORAGE = 'redis' needs the redis package ({exc}): {INSTALL_HINT}"
        ) from exc


def default_options() -> dict[str, Any]:
    """The keyword arguments every client built here gets unless REDIS_OPTIONS says otherwise.

    A command is retried 3 times after a ConnectionError or TimeoutError, 0.1, 0.2 then 0.4 s
    apart (exponential backoff from 50 ms, capped at 1 s): a Redis restart or failover of well
    under a second goes unnoticed. A command that timed out may have run before it is sent
    again; the storage's compare-and-set scripts then find their expected state gone."""
    require_redis()
    from redis.backoff import ExponentialBackoff
    from redis.exceptions import ConnectionError, TimeoutError
    from redis.retry import Retry

    return {
        "decode_responses": True,
        "socket_connect_timeout": SOCKET_CONNECT_TIMEOUT,
        "socket_timeout": SOCKET_TIMEOUT,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
        "retry": Retry(
            ExponentialBackoff(cap=1.0, base=0.05),
            RETRIES,
            supported_errors=(ConnectionError, TimeoutError),
        ),
        **_driver_info(),
    }


def _driver_info() -> dict[str, Any]:
    """redis-py's CLIENT SETINFO name and version, read once: redis-py 7.1+ otherwise reads its
    own package metadata (importlib.metadata, ~1 ms of Python) for every new connection, and a
    worker opens one per thread. Earlier versions read it once at import and take no such
    option. The same values are sent as without it."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return {}
    return {"driver_info": DriverInfo()}


def connect(settings: ExecutorSettings) -> redis.Redis | redis.cluster.RedisCluster:
    """A redis-py client for the settings, in this order of precedence:

    ``REDIS_CACHE_ALIAS`` (the connection pool of that Django cache, client used as is: it may
    return bytes), ``REDIS_SENTINEL`` (the master of the service, followed through failovers),
    ``REDIS_CLUSTER`` (``REDIS_URL`` names any one node), else ``REDIS_URL``.

    Only a Cluster client talks to Redis here (it discovers the nodes at once, and raises if none
    answers); the others connect on their first command. Thread-safe: share one client.
    Raises ImproperlyConfigured when the redis package is missing or the cache alias is not a
    Redis cache."""
    if settings.REDIS_CACHE_ALIAS:
        return _cache_client(settings.REDIS_CACHE_ALIAS)
    options = {**default_options(), **settings.REDIS_OPTIONS}
    if {"lib_name", "lib_version"} & settings.REDIS_OPTIONS.keys():
        options.pop("driver_info", None)  # redis-py would ignore them beside a driver_info
    if settings.REDIS_SENTINEL:
        return _sentinel_client(settings.REDIS_SENTINEL, options)
    if settings.REDIS_CLUSTER:
        from redis.cluster import RedisCluster

        # redis-py ignores health_check_interval for cluster nodes: not passed, not pretended.
        options.pop("health_check_interval", None)
        return RedisCluster.from_url(settings.REDIS_URL, **options)
    from redis import Redis

    return Redis.from_url(settings.REDIS_URL, **options)


def _sentinel_client(config: dict[str, Any], options: dict[str, Any]) -> redis.Redis:
    from redis.sentinel import Sentinel

    # Sentinels are asked with the socket timeouts of the data connections unless
    # sentinel_kwargs says otherwise (redis-py does the same when sentinel_kwargs is None).
    sentinel_kwargs = {
        **{key: value for key, value in options.items() if key.startswith("socket_")},
        **(config.get("sentinel_kwargs") or {}),
    }
    sentinel = Sentinel(
        [(host, port) for host, port in config["sentinels"]],
        sentinel_kwargs=sentinel_kwargs,
    )
    master: redis.Redis = sentinel.master_for(
        config["service_name"],
        db=config.get("db", 0),
        password=config.get("password"),
        username=config.get("username"),
        **options,
    )
    return master


def _cache_client(alias: str) -> redis.Redis:
    """The write client of a Django Redis cache: django-redis, or Django's built-in RedisCache.

    ``caches[alias]`` is per thread, and so is the pool behind it; redis-py pools are
    thread-safe, so the client returned may be shared by every thread of the worker."""
    from django.core.cache import InvalidCacheBackendError, caches

    require_redis()
    try:
        cache = caches[alias]
    except InvalidCacheBackendError as exc:
        raise ImproperlyConfigured(
            f"RELIABLE_EXECUTOR['REDIS_CACHE_ALIAS'] = {alias!r}: {exc}"
        ) from exc
    if is_shareable_cache(type(cache)):
        from django.core.cache.backends.redis import RedisCache

        if isinstance(cache, RedisCache):
            # Django has no public accessor: _cache is the RedisCacheClient the backend builds
            # lazily, and get_client(write=True) picks the first (primary) LOCATION.
            client: redis.Redis = cache._cache.get_client(write=True)
            return client
        from django_redis import get_redis_connection

        try:
            raw: redis.Redis = get_redis_connection(alias, write=True)
        except NotImplementedError as exc:  # e.g. the sharded client: no single connection
            raise ImproperlyConfigured(
                f"RELIABLE_EXECUTOR['REDIS_CACHE_ALIAS'] = {alias!r}: the cache backend "
                f"{_name(type(cache))} has no single Redis connection to share ({exc})"
            ) from exc
        return raw
    raise ImproperlyConfigured(cache_backend_problem(alias, type(cache)))


def is_shareable_cache(backend: type) -> bool:
    """A backend class whose Redis connection :func:`connect` can share."""
    from django.core.cache.backends.redis import RedisCache

    return issubclass(backend, RedisCache) or backend.__module__.split(".")[0] == "django_redis"


def cache_backend_problem(alias: str, backend: type) -> str:
    return (
        f"RELIABLE_EXECUTOR['REDIS_CACHE_ALIAS'] = {alias!r} names a cache whose backend is "
        f"{_name(backend)}: expected django.core.cache.backends.redis.RedisCache or a "
        "django-redis cache (django_redis.cache.RedisCache)"
    )


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def describe(settings: ExecutorSettings) -> str:
    """Where :func:`connect` connects, passwords masked: for error messages and logs."""
    if settings.REDIS_CACHE_ALIAS:
        alias = settings.REDIS_CACHE_ALIAS
        from django.conf import settings as django_settings

        location = getattr(django_settings, "CACHES", {}).get(alias, {}).get("LOCATION")
        if isinstance(location, (list, tuple)) and location:
            location = location[0]
        if isinstance(location, str) and location:
            return f"cache {alias!r} ({mask_url(location.split(',')[0].split(';')[0])})"
        return f"cache {alias!r}"
    if settings.REDIS_SENTINEL:
        config = settings.REDIS_SENTINEL
        nodes = ", ".join(f"{host}:{port}" for host, port in config["sentinels"])
        return f"sentinel {config['service_name']} via {nodes}"
    if settings.REDIS_CLUSTER:
        return f"cluster via {mask_url(settings.REDIS_URL)}"
    return mask_url(settings.REDIS_URL)
