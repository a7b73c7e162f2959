"""checks: the system checks name the bad setting, alias or unreachable database."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_reliable_executor.checks import check_settings
from tests.support.bad_settings import BAD_SETTINGS


@pytest.mark.parametrize("key", sorted(BAD_SETTINGS))
def test_system_check_error_names_the_key(key):
    with override_settings(RELIABLE_EXECUTOR={key: BAD_SETTINGS[key][0]}):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E001", key)]
    assert key in errors[0].msg


def test_system_check_passes_on_the_test_settings():
    assert check_settings() == []


def test_system_check_unknown_database_alias():
    with override_settings(RELIABLE_EXECUTOR={"DATABASE_ALIAS": "nowhere"}):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E002", "DATABASE_ALIAS")]
    assert "DATABASE_ALIAS" in errors[0].msg


def test_system_check_unknown_cache_alias():
    settings = {"STORAGE": "redis", "REDIS_CACHE_ALIAS": "nowhere"}
    with override_settings(RELIABLE_EXECUTOR=settings):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E003", "REDIS_CACHE_ALIAS")]


def test_database_check_reports_an_unreachable_task_database():
    from django.db import connections

    from django_reliable_executor.checks import check_database

    wrapper = connections["postgres"]
    wrapper.close()
    port = wrapper.settings_dict["PORT"]
    wrapper.settings_dict["PORT"] = "1"  # nothing listens there
    try:
        with override_settings(RELIABLE_EXECUTOR={"DATABASE_ALIAS": "postgres"}):
            errors = check_database(databases=["postgres"])
    finally:
        wrapper.close()
        wrapper.settings_dict["PORT"] = port
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E006", "DATABASE_ALIAS")]
    assert "cannot be reached" in errors[0].msg


def test_system_check_needs_use_tz():
    with override_settings(USE_TZ=False):
        errors = check_settings()
    assert [(e.id, e.obj) for e in errors] == [("reliable_executor.E004", "USE_TZ")]
