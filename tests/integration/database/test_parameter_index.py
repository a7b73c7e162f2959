"""The database storage's parameter index (setting SEARCHABLE_PARAMETERS): an indexed search
finds exactly what the plain one finds, through the index rows; the rows are written with their
tasks (all or nothing), replaced by a debounced submit's join, purged with their tasks, and
filled for older tasks by ``executor index-parameters``."""

from __future__ import annotations

import datetime as dt
import enum
import threading
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connections, transaction
from django.test import override_settings

from django_reliable_executor import TaskStatus, TaskSubmitRequest
from django_reliable_executor.core.parameter_index import canonical
from django_reliable_executor.exceptions import TaskSubmitError
from django_reliable_executor.master.schedule_firing import ScheduleFiring
from django_reliable_executor.models import ReliableTaskParameter
from django_reliable_executor.service.reliable_executor import executor as module_executor
from tests.conftest import DB_ALIASES, db_params
from tests.support.contract_support import claim_one, run_claim

# Every database searches alike; SQLite and MariaDB/MySQL keep the index rows, PostgreSQL reads
# its GIN index of every parameter instead and keeps none (storage/database/parameter_rows.py).
every_database = pytest.mark.parametrize("alias", db_params(DB_ALIASES))
keeping_rows = pytest.mark.parametrize("alias", db_params(["default", "mariadb"]))

KEYS = ("customer_id", "city", 'say "hi"', "note", "flag", "code")
LONG = "x" * 300
PARAMETERS = {
    "int": {"customer_id": 42, "city": "Zürich"},
    "float": {"customer_id": 42.0, "city": "zürich"},
    "text": {"customer_id": "42", "city": "Zürich "},
    "bool": {"customer_id": True, "flag": True},
    "one": {"customer_id": 1, "flag": False, "note": None},
    "nested": {"customer_id": [42], "city": {"name": "Zürich"}},
    "long": {"code": LONG, 'say "hi"': 'a "quoted" \\ value'},
    "long-other": {"code": LONG[:-1] + "y", 'say "hi"': 1},
    "list": [{"customer_id": 42}],
    "none": None,
}
SEARCHES = [
    {"customer_id": 42},
    {"customer_id": 42.0},
    {"customer_id": "42"},
    {"customer_id": True},
    {"customer_id": 1},
    {"flag": False},
    {"note": None},
    {"city": "Zürich"},
    {"city": "zürich"},
    {"city": "Zürich "},
    {"code": LONG},
    {"code": LONG[:-1] + "y"},
    {'say "hi"': 'a "quoted" \\ value'},
    {'say "hi"': 1},
    {"customer_id": 42, "city": "Zürich"},
    {"customer_id": 42, "city": "nowhere"},
    {"customer_id": 42, "region": "not indexed"},
]


def searchable(*keys: str):
    return override_settings(
        RELIABLE_EXECUTOR={**settings.RELIABLE_EXECUTOR, "SEARCHABLE_PARAMETERS": keys}
    )


def ids(tasks) -> list[str]:
    return [task.task_id for task in tasks]


def index_rows(alias: str) -> list[tuple[str, str, str]]:
    rows = ReliableTaskParameter.objects.using(alias).values_list("task_id", "key", "value")
    return sorted(rows)


def submit_all(executor, clock) -> None:
    executor.submit_many(
        [TaskSubmitRequest("demo.echo", value, task_id=key) for key, value in PARAMETERS.items()]
    )
    clock.advance(1)
    for key, value in PARAMETERS.items():
        executor.submit("demo.echo", value, task_id=key + "-later")
        clock.advance(1)


@every_database
def test_an_indexed_search_finds_what_the_plain_one_finds(executor, clock, alias):
    with searchable(*KEYS):
        submit_all(executor, clock)
        indexed = {str(s): ids(executor.list_tasks(parameter=s)) for s in SEARCHES}
    plain = {str(s): ids(executor.list_tasks(parameter=s)) for s in SEARCHES}
    assert indexed == plain
    assert plain[str({"customer_id": 42})] == ["float-later", "int-later", "float", "int"]
    assert plain[str({"city": "Zürich "})] == ["text-later", "text"]  # "A " is not "A"
    assert plain[str({"code": LONG})] == ["long-later", "long"]
    if alias == "postgres":
        assert index_rows(alias) == []
        return
    # One row per task and searchable key holding a scalar, the long value a digest.
    rows = index_rows(alias)
    assert ("int", "customer_id", "42") in rows and ("float", "customer_id", "42") in rows
    assert ("text", "customer_id", '"42"') in rows and ("bool", "customer_id", "true") in rows
    assert ("long", "code", canonical(LONG)) in rows and canonical(LONG).startswith("#")
    assert not [row for row in rows if row[0].startswith(("nested", "list", "none"))]
    # The indexed search reads the index: a task without its rows is not found by it.
    ReliableTaskParameter.objects.using(alias).filter(task_id="int").delete()
    with searchable(*KEYS):
        assert ids(executor.list_tasks(parameter={"customer_id": 42})) == [
            "float-later",
            "int-later",
            "float",
        ]
    with searchable("flag"):  # customer_id not searchable: every task is read
        assert "int" in ids(executor.list_tasks(parameter={"customer_id": 42}))


class Level(int, enum.Enum):
    LOW = 1


class Ratio(float, enum.Enum):
    HALF = 0.5


class Word(str, enum.Enum):
    A = "a"


@every_database
@pytest.mark.parametrize(
    "stored, wanted",
    [(Level.LOW, 1), (1, Level.LOW), (Ratio.HALF, 0.5), (Word.A, "a"), ("a", Word.A)],
    ids=["int-enum", "search-int-enum", "float-enum", "str-enum", "search-str-enum"],
)
def test_enum_members_are_indexed_as_their_json(executor, alias, stored, wanted):
    # A mixed-in Enum member is stored as its JSON value (1, not "Level.LOW"): its index text
    # and the search's condition are that value's too.
    with searchable("customer_id"):
        executor.submit("demo.echo", {"customer_id": stored}, task_id="t")
        indexed = ids(executor.list_tasks(parameter={"customer_id": wanted}))
    assert indexed == ids(executor.list_tasks(parameter={"customer_id": wanted})) == ["t"]


@every_database
def test_combines_with_the_other_filters_and_pages(executor, storage, clock, alias):
    wanted = {"customer_id": 42}
    with searchable("customer_id"):
        submit_all(executor, clock)
        executor.submit("demo.cpu", {"customer_id": 42, "iterations": 1}, task_id="other")
        clock.advance(1)
        executor.submit("demo.echo", wanted, task_id="tagged", tags=["import"], queue="q2")
        clock.advance(1)
        executor.submit_batch(
            [TaskSubmitRequest("demo.echo", wanted, task_id="member")], batch_id="b1"
        )
        find = executor.list_tasks
        assert ids(find(parameter=wanted, task_name="demo.cpu")) == ["other"]
        assert ids(find(parameter=wanted, tag="import")) == ["tagged"]
        assert ids(find(parameter=wanted, queue="q2")) == ["tagged"]
        assert ids(find(parameter=wanted, batch_id="b1")) == ["member"]
        assert find(parameter={"customer_id": 7}, tag="import") == []
        every = ids(find(parameter=wanted))
        assert every[:3] == ["member", "tagged", "other"] and len(every) == 7
        assert ids(find(parameter=wanted, limit=2, offset=2)) == every[2:4]
        assert run_claim(executor, claim_one(storage, queue="q2")) is TaskStatus.COMPLETED
        assert ids(find(parameter=wanted, status="COMPLETED")) == ["tagged"]
        assert "tagged" not in ids(find(parameter=wanted, status="CREATED"))


@every_database
def test_planned_schedule_fires_are_found(executor, clock, alias):
    # A planned run is stored by the master (fire_task, no submit prepared it): it gets its
    # index rows there too, so an indexed search finds it as the plain one does.
    with searchable("customer_id"):
        executor.schedule("tick", "demo.echo", {"customer_id": 9}, every=60)
        clock.advance(61)
        ScheduleFiring(executor).run_once()
        indexed = ids(executor.list_tasks(parameter={"customer_id": 9}))
    plain = ids(executor.list_tasks(parameter={"customer_id": 9}))
    assert len(plain) == 1
    assert indexed == plain


@keeping_rows
def test_a_refused_submit_stores_no_index_rows(executor, clock, alias):
    with searchable("customer_id"):
        executor.submit("demo.echo", {"customer_id": 1}, task_id="kept")
        with pytest.raises(TaskSubmitError):
            executor.submit_many(
                [
                    TaskSubmitRequest("demo.echo", {"customer_id": 2}, task_id="a"),
                    TaskSubmitRequest(
                        "demo.echo", {"customer_id": 3}, task_id="b", tags=["x" * 65]
                    ),
                ]
            )
        with pytest.raises(TaskSubmitError):  # refused by the storage, after storing "c"
            executor.submit_many(
                [
                    TaskSubmitRequest("demo.echo", {"customer_id": 4}, task_id="c"),
                    TaskSubmitRequest(
                        "demo.echo", {"customer_id": 5}, task_id="d", depends_on=["missing"]
                    ),
                ]
            )
    assert executor.get_task("c") is None
    assert index_rows(alias) == [("kept", "customer_id", "1")]


@keeping_rows
def test_a_debounced_join_replaces_the_rows(executor, clock, alias):
    with searchable("customer_id", "city"):
        first = executor.submit(
            "demo.echo", {"customer_id": 1, "city": "Oslo"}, debounce=10, unique_key="k"
        )
        clock.advance(2)
        joined = executor.submit("demo.echo", {"customer_id": 2}, debounce=10, unique_key="k")
        assert joined.task_id == first.task_id and joined.debounced
        assert index_rows(alias) == [(first.task_id, "customer_id", "2")]
        assert ids(executor.list_tasks(parameter={"customer_id": 2})) == [first.task_id]
        assert executor.list_tasks(parameter={"customer_id": 1}) == []
        assert executor.list_tasks(parameter={"city": "Oslo"}) == []


@pytest.mark.parametrize("alias", db_params(["mariadb"]))
def test_a_join_on_an_older_snapshot_keeps_its_value_indexed(executor, clock, alias):
    # REPEATABLE READ (a project's choice; Django's default is READ COMMITTED): the caller's
    # snapshot still shows the row of 3 that another join (to 2) deleted; joining back to 3
    # must put it back, or the task is lost to a search of its own value.
    with searchable("customer_id"):
        first = executor.submit("demo.echo", {"customer_id": 3}, debounce=10, unique_key="k")
        clock.advance(1)

        def other_join() -> None:
            try:
                executor.submit("demo.echo", {"customer_id": 2}, debounce=10, unique_key="k")
            finally:
                connections[alias].close()

        with connections[alias].cursor() as cursor:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        try:
            with transaction.atomic(using=alias):
                list(ReliableTaskParameter.objects.using(alias).all())  # the snapshot
                thread = threading.Thread(target=other_join)
                thread.start()
                thread.join(10)
                assert not thread.is_alive()
                executor.submit("demo.echo", {"customer_id": 3}, debounce=10, unique_key="k")
        finally:
            with connections[alias].cursor() as cursor:
                cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        assert executor.get_task(first.task_id).parameter == {"customer_id": 3}
        assert ids(executor.list_tasks(parameter={"customer_id": 3})) == [first.task_id]


@keeping_rows
def test_the_purge_removes_the_rows(executor, storage, clock, alias):
    with searchable("customer_id"):
        executor.submit("demo.echo", {"customer_id": 1}, task_id="gone")
        executor.submit("demo.echo", {"customer_id": 1}, task_id="kept", queue="other")
        assert run_claim(executor, claim_one(storage)) is TaskStatus.COMPLETED
        assert len(index_rows(alias)) == 2
        clock.advance(10)
        assert storage.purge_finished(clock.now() - dt.timedelta(seconds=5), 10) == 1
        assert index_rows(alias) == [("kept", "customer_id", "1")]
        assert ids(executor.list_tasks(parameter={"customer_id": 1})) == ["kept"]


@keeping_rows
def test_index_parameters_fills_the_rows_of_older_tasks(executor, clock, alias):
    for n in range(5):
        executor.submit("demo.echo", {"customer_id": n % 2, "city": "Oslo"}, task_id=f"t{n}")
    executor.submit("demo.echo", [1, 2], task_id="t5")
    assert index_rows(alias) == []
    with searchable("customer_id"):
        executor.submit("demo.echo", {"customer_id": 1}, task_id="t6")
        # older tasks are not found by an indexed search until the command has run
        assert ids(executor.list_tasks(parameter={"customer_id": 1})) == ["t6"]
        # A row of a key no longer searchable is deleted; a row of a value the task does not
        # hold stays (the search checks the parameter: it finds nothing more by it).
        ReliableTaskParameter.objects.using(alias).create(key="city", value='"x"', task_id="t0")
        ReliableTaskParameter.objects.using(alias).create(
            key="customer_id", value="9", task_id="t1"
        )
        setting = {**settings.RELIABLE_EXECUTOR, "SEARCHABLE_PARAMETERS": ("customer_id",)}
        with override_settings(RELIABLE_EXECUTOR={**setting, "DATABASE_ALIAS": alias}):
            out = StringIO()
            call_command("executor", "index-parameters", "--chunk", "2", stdout=out)
            assert "7 tasks read: 5 index rows written, 1 deleted" in out.getvalue()
            rows = index_rows(alias)
            again = StringIO()
            call_command("executor", "index-parameters", "--after", "t3", stdout=again)
            assert "3 tasks read: 0 index rows written, 0 deleted" in again.getvalue()
            module_executor.storage.close()
        expected = [(f"t{n}", "customer_id", str(n % 2)) for n in range(5)]
        expected += [("t1", "customer_id", "9"), ("t6", "customer_id", "1")]
        assert index_rows(alias) == rows == sorted(expected)
        assert ids(executor.list_tasks(parameter={"customer_id": 1})) == ["t6", "t3", "t1"]
        assert executor.list_tasks(parameter={"customer_id": 9}) == []
    with searchable():  # no key searchable: the command deletes every row
        with override_settings(
            RELIABLE_EXECUTOR={**settings.RELIABLE_EXECUTOR, "DATABASE_ALIAS": alias}
        ):
            out = StringIO()
            call_command("executor", "index-parameters", stdout=out)
            module_executor.storage.close()
        assert "searchable parameters: none" in out.getvalue()
        assert index_rows(alias) == []


@keeping_rows
def test_the_columns_compare_byte_for_byte(alias):
    rows = ReliableTaskParameter.objects.using(alias)
    for value in ('"A"', '"a"', '"A "', '"Ä"', '"A\u0308"'):
        rows.create(key="k", value=value, task_id="t")
    for key in ("K", "k "):
        rows.create(key=key, value='"A"', task_id="t")
    assert rows.filter(key="k", value='"A"').count() == 1
    assert rows.filter(key="k", value='"A "').count() == 1
    assert rows.filter(key="k").count() == 5
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM reliable_executor_task_param WHERE task_id = %s", ["T"]
        )
        assert cursor.fetchone()[0] == 0


@pytest.mark.parametrize("alias", db_params(["postgres"]))
def test_postgresql_keeps_no_rows_and_has_nothing_to_fill(executor, alias):
    with searchable("customer_id"):
        executor.submit("demo.echo", {"customer_id": 1}, task_id="t1")
        assert ids(executor.list_tasks(parameter={"customer_id": 1})) == ["t1"]
        with override_settings(
            RELIABLE_EXECUTOR={**settings.RELIABLE_EXECUTOR, "DATABASE_ALIAS": alias}
        ):
            out = StringIO()
            call_command("executor", "index-parameters", stdout=out)
            module_executor.storage.close()
    assert "nothing to fill" in out.getvalue()
    assert index_rows(alias) == []
