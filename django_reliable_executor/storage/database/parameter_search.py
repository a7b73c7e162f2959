"""``list_tasks(parameter=...)`` in SQL: the condition a task row's JSON parameter must meet,
in each database's own JSON functions.

PostgreSQL: ``parameter @> '{...}'``, answered by the partial GIN index of migration 0036 (a
jsonb_path_ops index: it holds a hash of every path to a value, so a selective filter reads
only the rows that may match). MariaDB/MySQL and SQLite have no index over arbitrary keys:
they check the rows the other filters leave, newest first, until the page is full
(docs/benchmarks.md has what that costs). On MySQL/MariaDB that walk is bounded:
see ``parameter_page``. A key SEARCHABLE_PARAMETERS names is searched through the index rows
of parameter_rows.py instead (reading.py narrows the tasks to the value's rows): this
condition then checks only those.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, cast

from django.db import connections
from django.db.models import BooleanField, Q, QuerySet
from django.db.models.expressions import RawSQL

from ...core.parameter_filter import Pairs, pairs_json
from ...core.queries import TaskQuery

COLUMN = '"reliable_executor_task"."parameter"'
MYSQL_COLUMN = "`reliable_executor_task`.`parameter`"
# A stored JSON scalar's type as each database names it, by the searched value's Python type.
MYSQL_TYPES = {str: "'STRING'", bool: "'BOOLEAN'", type(None): "'NULL'"}
# (MySQL names an integer past 2**63 - 1 "UNSIGNED INTEGER"; MariaDB has no such type.)
MYSQL_NUMBER = "('INTEGER', 'UNSIGNED INTEGER', 'DOUBLE')"
SQLITE_TYPES = {True: "'true'", False: "'false'", None: "'null'"}
# MySQL/MariaDB: how many of the newest tasks (of the other filters) a search checks first.
PROBE = 2000


def parameter_page(vendor: str, alias: str, newest: QuerySet[Any], query: TaskQuery) -> list[str]:
    """The page's task ids, newest first, of the tasks of ``newest`` (the other filters, in
    listing order) whose parameter holds ``query.parameter``.

    MySQL/MariaDB walks an index in listing order and fetches each row by its primary key, a
    random read per task: a rare value meant a million random reads (15 s, and 71 s behind
    ``status=COMPLETED``, at 1M tasks with a 128 MB buffer pool). So the newest PROBE ids are
    read from the index alone and only their rows checked; when they hold the page, that is
    the answer (a common value: milliseconds). Otherwise one pass over the table in its own
    order, without index (``USE INDEX ()``), then a sort of the matches: its cost is the
    table's size, whatever the value (4 s there). A tag's or a batch's search reads only
    their rows, by the optimizer's own plan."""
    matching = newest.filter(parameter_filter(vendor, cast(Pairs, query.parameter)))
    page = matching.values_list("pk", flat=True)[query.offset : query.end]
    if vendor != "mysql" or query.tag is not None or query.batch_id is not None or query.indexed:
        # (a tag's, a batch's or an indexed value's rows are few: the optimizer reads them)
        return list(page)
    recent = list(newest.values_list("pk", flat=True)[:PROBE])
    found = list(matching.filter(pk__in=recent).values_list("pk", flat=True)[: query.end])
    if len(found) >= query.end or len(recent) < PROBE:
        return found[query.offset : query.end]
    sql, params = page.query.get_compiler(using=alias).as_sql()
    table = MYSQL_COLUMN.split(".")[0]
    sql = sql.replace(f"FROM {table}", f"FROM {table} USE INDEX ()", 1)
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]


def parameter_filter(vendor: str, pairs: Pairs) -> Q:
    """The condition, for ``QuerySet.filter``, that the row's parameter is a JSON object
    holding every (key, value) pair, values compared as JSON values (42 is not "42")."""
    if vendor == "postgresql":
        sql, params = _postgresql(pairs)
    elif vendor == "mysql":
        sql, params = _mysql(pairs)
    else:
        sql, params = _sqlite(pairs)
    return Q(RawSQL(sql, params, output_field=BooleanField()))


def _postgresql(pairs: Pairs) -> tuple[str, list[Any]]:
    """``parameter @> '{...}'``, with the index's own predicate (migration 0036), so that the
    planner may use it. jsonb compares numbers as the decimals written, where same_json
    compares a float by its exact value: 2.0**60 is stored as ``1.152921504606847e+18``
    (1152921504606847000), which equals 2**60 (1152921504606846976) only as a double. So a
    whole number that both texts name (a double past 1e16) is searched as either."""
    parts, params = [f"jsonb_typeof({COLUMN}) = 'object'"], []
    plain = tuple((key, value) for key, value in pairs if _two_texts(value) is None)
    if plain:
        parts.append(f"{COLUMN} @> CAST(%s AS jsonb)")
        params.append(pairs_json(plain))
    for key, value in pairs:
        texts = _two_texts(value)
        if texts is not None:
            parts.append(f"({COLUMN} @> CAST(%s AS jsonb) OR {COLUMN} @> CAST(%s AS jsonb))")
            params += [pairs_json(((key, number),)) for number in texts]
    return " AND ".join(parts), params


def _two_texts(value: Any) -> tuple[int, float] | None:
    """A whole number as an int and as the double of its value, when it is exactly a double
    whose JSON text (its repr) names another decimal: None for any other value."""
    if not _is_number(value) or not (isinstance(value, int) or value.is_integer()):
        return None
    try:
        double = float(value)
    except OverflowError:  # past the largest double: no double holds it
        return None
    if double != value or Decimal(float.__repr__(double)) == int(value):
        return None
    return int(value), double


def _mysql(pairs: Pairs) -> tuple[str, list[Any]]:
    """JSON_CONTAINS compares a value as JSON (true is not 1, "42" not 42); the types are
    checked too, as it also finds a value inside an array (``{"id": [42]}`` holds 42 to it).
    The candidate is written as the stored text was (core.serialization.dumps: no \\u escapes
    of non-ASCII), because MariaDB compares strings as written. A number is then compared
    exactly (``_mysql_number``): JSON_CONTAINS alone finds near ones."""
    parts = [f"JSON_TYPE({MYSQL_COLUMN}) = 'OBJECT'", f"JSON_CONTAINS({MYSQL_COLUMN}, %s)"]
    params: list[Any] = [pairs_json(pairs)]
    for key, value in pairs:
        kind = _mysql_kind(value)
        parts.append(f"JSON_TYPE(JSON_EXTRACT({MYSQL_COLUMN}, %s)) IN {kind}")
        params.append(json_path(key))
    for key, value in pairs:
        if _is_number(value):
            sql, args = _mysql_number(json_path(key), value)
            parts.append(sql)
            params += args
    return " AND ".join(parts), params


def _is_number(value: Any) -> bool:
    """Whether ``value`` is searched for as a JSON number (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mysql_number(path: str, value: int | float) -> tuple[str, list[Any]]:
    """The test that the number at ``path`` equals ``value`` exactly, as same_json compares.

    MariaDB's JSON_CONTAINS compares two numbers as doubles within 1e-12 of each other: 2**53
    finds 2**53 + 1 (a 64-bit id finds its neighbours), 0 finds 1e-13, 42 finds
    42.0000000000001. So a number written as an integer (its JSON text all digits, whatever
    its size) is compared by its text, the integer's own digits; one written as a double (a
    "." or an exponent: not by JSON_TYPE, which calls ``1e-13`` an INTEGER on MariaDB) by its
    double, when ``value`` is exactly one (no double equals 2**53 + 1). MySQL's JSON prints
    an integer as its digits and a double with a "." or an exponent too; CAST AS DOUBLE
    needs MySQL 8.0.17 or MariaDB 10.4."""
    stored = f"JSON_EXTRACT({MYSQL_COLUMN}, %s)"
    text = f"CAST({stored} AS CHAR)"
    arms, params = [], []
    if isinstance(value, int) or value.is_integer():
        arms.append(f"{text} = %s")
        params += [path, int.__repr__(int(value))]
    try:
        double = float(value)
    except OverflowError:  # past the largest double: only an integer can hold it
        double = None
    if double is not None and double == value:
        arms.append(f"({text} REGEXP '[.eE]' AND CAST({stored} AS DOUBLE) = CAST(%s AS DOUBLE))")
        params += [path, path, float.__repr__(double)]
    return "(" + " OR ".join(arms) + ")", params


def _mysql_kind(value: Any) -> str:
    """The JSON types MySQL/MariaDB may store ``value`` as: by isinstance, as the storage
    serialises it (an ``(int, Enum)`` member is stored as a number)."""
    if value is None or isinstance(value, bool):
        return f"({MYSQL_TYPES[type(None) if value is None else bool]})"
    return f"({MYSQL_TYPES[str]})" if isinstance(value, str) else MYSQL_NUMBER


def _sqlite(pairs: Pairs) -> tuple[str, list[Any]]:
    """Per pair, the stored value's JSON type (which tells true, 1 and "1" apart, and a missing
    key, NULL, from null) and its SQL value. Read by a JSON path: SQLite keeps the row's
    parsed JSON between json_type and json_extract (0.5 s over 1M rows, where a json_each
    lookup took 2.5 s); a key holding a quote or backslash, which no SQLite path can name, is
    found by json_each."""
    parts, params = [], []
    for key, value in pairs:
        if '"' in key or "\\" in key:
            test, args = _sqlite_test("p.type", "p.atom", value)
            test = f"EXISTS (SELECT 1 FROM json_each({COLUMN}) AS p WHERE p.key = %s AND {test})"
            args = [key, *args]
        elif _is_number(value) and not -(2**63) <= value < 2**63:
            test, args = _sqlite_big(f'$."{key}"', int(value))  # (such a float is whole)
        else:
            kind, scalar = f"json_type({COLUMN}, %s)", f"json_extract({COLUMN}, %s)"
            test, args = _sqlite_test(kind, scalar, value)
            path = f'$."{key}"'
            args = [path, *args] if len(args) == 0 else [path, path, *args]
        parts.append(test)
        params += args
    return " AND ".join(parts), params


def _sqlite_big(path: str, value: int) -> tuple[str, list[Any]]:
    """The test that the number at ``path`` is ``value``, a whole number past SQLite's 64
    bits (an int, or a float's value).

    SQLite reads such a JSON integer as a real (2**64 + 1 as 2**64), but keeps its text: the
    JSON array that json_extract answers for two paths holds it as written. So a stored
    integer is compared by its digits; a stored real by its value, when ``value`` is exactly
    a double (no double equals 2**64 + 1)."""
    digits = int.__repr__(value)
    test = f"json_type({COLUMN}, %s) = 'integer' AND json_extract({COLUMN}, %s, %s) = %s"
    args: list[Any] = [path, path, path, f"[{digits},{digits}]"]
    try:
        double = float(value)
    except OverflowError:  # past the largest double: only an integer can hold it
        double = None
    if double is not None and double == value:
        test = f"{test} OR json_type({COLUMN}, %s) = 'real' AND json_extract({COLUMN}, %s) = %s"
        args += [path, path, double]
    return f"({test})", args


def _sqlite_test(kind: str, scalar: str, value: Any) -> tuple[str, list[Any]]:
    """The test that a value of SQLite JSON type ``kind`` and SQL value ``scalar`` is ``value``."""
    if value is None or isinstance(value, bool):
        return f"{kind} = {SQLITE_TYPES[value]}", []
    if isinstance(value, str):
        return f"{kind} = 'text' AND {scalar} = %s", [value]
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        # Past SQLite's 64-bit integers (its driver cannot bind them), under a key only
        # json_each can name (_sqlite_big needs a path): compared as a real, as SQLite reads
        # such a JSON number (past the largest double, as infinity), so 2**64 finds 2**64 + 1
        # there.
        try:
            value = float(value)
        except OverflowError:
            value = math.inf if value > 0 else -math.inf
    return f"{kind} IN ('integer', 'real') AND {scalar} = %s", [value]


def json_path(key: str) -> str:
    """A MySQL/MariaDB JSON path to a top-level key: quoted, its quotes and backslashes
    escaped, so that any key names one member (``$."a.b"`` is the key "a.b")."""
    return '$."' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'
