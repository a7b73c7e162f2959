"""Settings of the test and demo project.

The default database is SQLite (no server needed). The test suite also uses the ``mariadb`` and
``postgres`` aliases; their locations come from the environment:

    RE_MARIADB_HOST (127.0.0.1) RE_MARIADB_PORT (3306) RE_MARIADB_USER (root)
    RE_MARIADB_PASSWORD ("") RE_MARIADB_NAME (reliable_executor)
    RE_POSTGRES_HOST (127.0.0.1) RE_POSTGRES_PORT (5432) RE_POSTGRES_USER (postgres)
    RE_POSTGRES_PASSWORD ("") RE_POSTGRES_NAME (reliable_executor)

``RE_DATABASE`` (default|mariadb|postgres) picks which alias the executor stores tasks in, and
``RE_TEST_DB_NAMES=1`` points every alias at its test database (runexecutor subprocesses started by
the tests must see the tables pytest created).

``RE_STORAGE`` (database|redis; default database) picks the task storage. With ``redis`` the tasks
live in Redis at ``RE_REDIS_URL`` (default redis://127.0.0.1:6379/0) under ``RE_KEY_PREFIX``
(default reliable_executor), and ``RE_DATABASE`` only names the database of the demo app's tables.
Each of the three sets its RELIABLE_EXECUTOR key only when given, so the app's defaults apply.
``RE_REDIS_CLUSTER=1`` sets ``REDIS_CLUSTER``: ``RE_REDIS_URL`` is then one node of a Cluster.

Under pytest every run gets databases of its own: ``RE_DB_SUFFIX`` (default: the pytest process
id) is appended to every database name and exported, so subprocesses inherit it and parallel runs
(two tox environments, two developers) never share or drop each other's test databases.
"""

import os
import sys
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "testproject-not-secret"
# RE_DEBUG=0 for benchmarks: DEBUG keeps every SQL query in memory.
DEBUG = os.environ.get("RE_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "testproject.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "/static/"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_reliable_executor",
    "demo",
]

# Django's Tasks framework (django.tasks on Django 6; the django-tasks backport on 5.2), run by
# this app: testproject/djtasks holds the @task functions the tests enqueue.
try:
    import django.tasks  # noqa: F401

    HAVE_DJANGO_TASKS = True
except ImportError:
    try:
        import django_tasks  # noqa: F401

        HAVE_DJANGO_TASKS = True
        INSTALLED_APPS.append("django_tasks")
    except ImportError:
        HAVE_DJANGO_TASKS = False
if HAVE_DJANGO_TASKS:
    INSTALLED_APPS.append("djtasks")
    TASKS = {
        "default": {
            "BACKEND": "django_reliable_executor.tasks_backend.ReliableExecutorBackend",
            "QUEUES": ["default", "djtasks"],
            "OPTIONS": {"retry_limit": 0},
        },
        # A second alias whose OPTIONS retry: per-backend defaults, on every Django version.
        "retrying": {
            "BACKEND": "django_reliable_executor.tasks_backend.ReliableExecutorBackend",
            "QUEUES": ["default", "djtasks"],
            "OPTIONS": {
                "retry_limit": 2,
                "retry_interval": 0,
                "retry_on": ["builtins.ConnectionError"],
            },
        },
    }

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

env = os.environ.get
test_names = env("RE_TEST_DB_NAMES") == "1"
if "pytest" in sys.modules and not env("RE_DB_SUFFIX"):
    os.environ["RE_DB_SUFFIX"] = f"_{os.getpid()}"
suffix = env("RE_DB_SUFFIX", "")
if "pytest" in sys.modules:
    # The admin and API tests log a new user in for almost every test: the default hasher's
    # deliberate slowness (about 0.3 s a password here) was a fifth of the suite's time.
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _name(name: str) -> str:
    return f"test_{name}{suffix}" if test_names else f"{name}{suffix}"


SQLITE_PATH = env("RE_SQLITE_PATH", str(BASE_DIR / "db.sqlite3"))
SQLITE_TEST_PATH = env("RE_SQLITE_TEST_PATH", str(BASE_DIR / f"test_db{suffix}.sqlite3"))

DATABASES: dict = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": SQLITE_TEST_PATH if test_names else SQLITE_PATH,
        # WAL lets readers run beside the single writer; IMMEDIATE takes the write lock at
        # BEGIN so two writers queue up instead of failing with "database is locked".
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # A file, not memory: runexecutor subprocesses started by the tests share it.
        "TEST": {"NAME": SQLITE_TEST_PATH},
    },
}
# The server databases exist only where wanted: under the tests, or when RE_DATABASE names one.
# (Django 6 checks every configured alias before a command, and the demo must run without
# any server.)
SERVER_DATABASES = {
    "mariadb": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": _name(env("RE_MARIADB_NAME", "reliable_executor")),
        "HOST": env("RE_MARIADB_HOST", "127.0.0.1"),
        "PORT": env("RE_MARIADB_PORT", "3306"),
        "USER": env("RE_MARIADB_USER", "root"),
        "PASSWORD": env("RE_MARIADB_PASSWORD", ""),
        "OPTIONS": {"charset": "utf8mb4"},
        # No dependency on "default", so a run that selects only this alias can set it up.
        "TEST": {"CHARSET": "utf8mb4", "DEPENDENCIES": []},
    },
    "postgres": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _name(env("RE_POSTGRES_NAME", "reliable_executor")),
        "HOST": env("RE_POSTGRES_HOST", "127.0.0.1"),
        "PORT": env("RE_POSTGRES_PORT", "5432"),
        "USER": env("RE_POSTGRES_USER", "postgres"),
        "PASSWORD": env("RE_POSTGRES_PASSWORD", ""),
        "TEST": {"DEPENDENCIES": []},
    },
}
for _alias, _config in SERVER_DATABASES.items():
    if "pytest" in sys.modules or test_names or env("RE_DATABASE") == _alias:
        DATABASES[_alias] = _config

RELIABLE_EXECUTOR: dict = {
    "DATABASE_ALIAS": env("RE_DATABASE", "default"),
}
for _key in ("STORAGE", "REDIS_URL", "KEY_PREFIX"):
    _text = env(f"RE_{_key}")
    if _text:
        RELIABLE_EXECUTOR[_key] = _text
if env("RE_REDIS_CLUSTER") == "1":  # RE_REDIS_URL then names one node of a Redis Cluster
    RELIABLE_EXECUTOR["REDIS_CLUSTER"] = True
_shards = env("RE_REDIS_SHARDS")
if _shards:  # the number of Redis shards (the tests' TEST_REDIS_SHARDS, passed on)
    RELIABLE_EXECUTOR["REDIS_SHARDS"] = int(_shards)
for _key in ("LEASE_TIMEOUT", "MASTER_LOCK_TTL", "POLL_INTERVAL"):
    _value = env(f"RE_{_key}")
    if _value:
        RELIABLE_EXECUTOR[_key] = float(_value)

LOGGING: dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "django_reliable_executor.logging.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_reliable_executor": {
            "handlers": ["console"],
            "level": env("RE_LOG_LEVEL", "WARNING"),
        }
    },
}
# RE_LOG_JSON=<file>: the app's log lines also go to that file, one JSON object a line.
if env("RE_LOG_JSON"):
    LOGGING["handlers"]["json_file"] = {
        "class": "logging.FileHandler",
        "filename": env("RE_LOG_JSON"),
        "formatter": "json",
    }
    LOGGING["loggers"]["django_reliable_executor"]["handlers"].append("json_file")

# Tracing and blocked imports for the tests (testproject/observability.py): RE_OTEL_SPANS,
# RE_BLOCK_IMPORTS, RE_IMPORT_ATTEMPTS.
from testproject import observability  # noqa: E402

observability.configure()
