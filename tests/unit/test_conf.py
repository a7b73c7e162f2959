"""conf: the RELIABLE_EXECUTOR settings, validated key by key, and their defaults."""

from __future__ import annotations

import dataclasses

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_reliable_executor.conf import KNOWN_KEYS, ExecutorSettings, get_settings, validate
from tests.support.bad_settings import BAD_SETTINGS

GOOD_SETTINGS = {
    "STORAGE": "redis",
    "DATABASE_ALIAS": "other",
    "REDIS_URL": "rediss://cache:6380/2",
    "REDIS_CACHE_ALIAS": "redis",
    "REDIS_CLUSTER": False,  # True, or a REDIS_SENTINEL, would conflict with REDIS_CACHE_ALIAS
    "REDIS_SENTINEL": None,
    "REDIS_OPTIONS": {"ssl_ca_certs": "/etc/ssl/redis-ca.pem", "socket_timeout": 3},
    "KEY_PREFIX": "shop",
    "REDIS_SHARDS": 4,
    "CORE_POOL_SIZE": 2,
    "MAX_POOL_SIZE": 4,
    "QUEUE_CAPACITY": 0,
    "ASYNC_CONCURRENCY": 0,
    "POOL": "process",
    "MAX_TASKS_PER_CHILD": 500,
    "POLL_INTERVAL": 0.2,
    "LEASE_TIMEOUT": 30,
    "MASTER_LOCK_TTL": 5.5,
    "DEFAULT_RETRY_LIMIT": 0,
    "DEFAULT_RETRY_INTERVAL": 0,
    "DEFAULT_RETRY_BACKOFF": "exponential",
    "DEFAULT_RETRY_BACKOFF_MAX": 0,
    "DEFAULT_MAX_DURATION": 1,
    "FINISHED_RETENTION": 0,
    "MAX_PARAMETER_BYTES": 1,
    "ALLOW_UNKNOWN_TASKS": True,
    "METRICS_PORT": 0,
    "API_KEYS": {"ops-1": "s" * 32},
    "API_SIGNATURE_WINDOW": 60,
    "SCHEDULE_MISFIRE_GRACE": 0,
    "SCHEDULE_CATCH_UP_LIMIT": 1,
    "SEARCHABLE_PARAMETERS": ["customer_id", "order_id"],
}


def test_every_key_is_covered_here():
    assert set(BAD_SETTINGS) == set(GOOD_SETTINGS) == KNOWN_KEYS


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, value) for key, values in BAD_SETTINGS.items() for value in values],
)
def test_validate_names_the_bad_key(key, value):
    problems = validate({key: value})
    assert [k for k, _ in problems] == [key]
    assert f"RELIABLE_EXECUTOR[{key!r}]" in problems[0][1]
    if key == "API_KEYS" and isinstance(value, dict):  # the secrets are masked
        assert repr({key_id: "***" for key_id in value}) in problems[0][1]
        assert all(str(secret) not in problems[0][1] for secret in value.values())
    else:
        assert repr(value) in problems[0][1]


def test_validate_accepts_good_values_and_nothing():
    assert validate(GOOD_SETTINGS) == []
    assert validate({}) == []
    assert validate(None) == []


def test_validate_reports_unknown_keys_and_non_dicts():
    assert validate({"LEASE_TIMOUT": 5}) == [
        (
            "LEASE_TIMOUT",
            "RELIABLE_EXECUTOR['LEASE_TIMOUT'] is not a known key (did you mean 'LEASE_TIMEOUT'?)",
        )
    ]
    # Far from every key: no guess.
    assert validate({"XYZZY": 5}) == [("XYZZY", "RELIABLE_EXECUTOR['XYZZY'] is not a known key")]
    [(key, message)] = validate(["STORAGE"])
    assert key == "RELIABLE_EXECUTOR"
    assert "must be a dict" in message


def test_validate_max_pool_size_below_core_pool_size():
    [(key, message)] = validate({"CORE_POOL_SIZE": 8, "MAX_POOL_SIZE": 4})
    assert key == "MAX_POOL_SIZE"
    assert message == "RELIABLE_EXECUTOR['MAX_POOL_SIZE'] = 4 must be >= CORE_POOL_SIZE (8)"


def test_a_core_pool_size_alone_raises_the_maximum_with_it(settings):
    # As runexecutor --core-pool-size does: the default MAX_POOL_SIZE is 10.
    assert validate({"CORE_POOL_SIZE": 11}) == []
    settings.RELIABLE_EXECUTOR = {"CORE_POOL_SIZE": 11}
    assert (get_settings().CORE_POOL_SIZE, get_settings().MAX_POOL_SIZE) == (11, 11)
    settings.RELIABLE_EXECUTOR = {"CORE_POOL_SIZE": 4}
    assert (get_settings().CORE_POOL_SIZE, get_settings().MAX_POOL_SIZE) == (4, 10)


def test_validate_reports_every_problem():
    problems = validate({"STORAGE": "x", "LEASE_TIMEOUT": 0, "NOPE": 1})
    assert sorted(key for key, _ in problems) == ["LEASE_TIMEOUT", "NOPE", "STORAGE"]


def test_get_settings_follows_overrides_and_refuses_bad_values():
    base = get_settings()
    with override_settings(RELIABLE_EXECUTOR={"LEASE_TIMEOUT": 5, "QUEUE_CAPACITY": 3}):
        current = get_settings()
        assert (current.LEASE_TIMEOUT, current.QUEUE_CAPACITY) == (5.0, 3)
        assert isinstance(current.LEASE_TIMEOUT, float)
    with (
        override_settings(RELIABLE_EXECUTOR={"QUEUE_CAPACITY": -1}),
        pytest.raises(ImproperlyConfigured, match="QUEUE_CAPACITY"),
    ):
        get_settings()
    assert get_settings() == base


def test_executor_settings_defaults_match_the_design():
    defaults = ExecutorSettings()
    assert (defaults.CORE_POOL_SIZE, defaults.MAX_POOL_SIZE, defaults.QUEUE_CAPACITY) == (
        5,
        10,
        100,
    )
    assert defaults.ASYNC_CONCURRENCY == 100
    assert defaults.POOL == "thread" and defaults.MAX_TASKS_PER_CHILD is None
    assert (defaults.DEFAULT_RETRY_LIMIT, defaults.DEFAULT_RETRY_INTERVAL) == (3, 2000)
    assert (defaults.DEFAULT_RETRY_BACKOFF, defaults.DEFAULT_RETRY_BACKOFF_MAX) == ("fixed", 300000)
    assert defaults.MAX_PARAMETER_BYTES == 1048576
    assert defaults.ALLOW_UNKNOWN_TASKS is False
    assert validate(dataclasses.asdict(defaults)) == []
