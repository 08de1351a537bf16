"""Statements of the recording hot path, run on the database driver's own cursor.

Every answered model call inserts its completion rows (and, for a new conversation, its
session) inside the writer's group commit. Through SQLAlchemy Core each of those statements
costs ~100 µs of CPU before the driver sees it (compile-cache lookup, an execution context,
a bind processor per value): ~175 µs a one-choice turn, measured, against ~140 µs for the
driver's own work. So the few hot statements are written here as SQL text once per column set, with
the values converted as SQLAlchemy's column types would (JSON as text, booleans and blobs
as the driver takes them), inside the transaction SQLAlchemy opened on the same connection.

A driver error leaves as SQLAlchemy's `DBAPIError`, with the connection invalidated when the
driver reports a disconnect, exactly as a Core statement would fail: the writer's retry and
outage handling (`proxy/store/db.py`) sees no difference. Reads and the rest of the writes
stay on SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import orjson
from sqlalchemy import JSON, Connection, Table
from sqlalchemy import exc as sa_exc

Rows = Sequence[dict[str, Any]]  # dicts with the same keys, named by column


def _json_text(value: Any) -> str:
    # SQLAlchemy's JSON type stores None as the JSON `null` too (none_as_null=False).
    try:
        return orjson.dumps(value).decode()
    except (orjson.JSONEncodeError, TypeError):  # e.g. an integer past 64 bits, a non-string key
        return json.dumps(value)


def _native(sql: str, paramstyle: str) -> str:
    """`sql` written with `?` placeholders, in the driver's style (psycopg's `%s`)."""
    return sql if paramstyle == "qmark" else sql.replace("?", "%s")


@lru_cache(maxsize=64)
def _insert_sql(table: Table, columns: tuple[str, ...], paramstyle: str, n: int = 1) -> tuple[str, tuple[bool, ...]]:
    """The INSERT of `n` rows of `columns` into `table` in the driver's parameter style, and which
    columns are JSON."""
    row = f"({', '.join('?' for _ in columns)})"
    sql = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES {', '.join(row for _ in range(n))}"
    return _native(sql, paramstyle), tuple(isinstance(table.c[name].type, JSON) for name in columns)


def _values(rows: Rows, columns: tuple[str, ...], is_json: tuple[bool, ...]) -> list[tuple]:
    return [tuple(_json_text(row[c]) if j else row[c] for c, j in zip(columns, is_json, strict=True)) for row in rows]


def _insert_values(conn: Connection, table: Table, rows: Rows) -> tuple[str, list[Any]]:
    """One INSERT of all `rows` (a multi-row VALUES) and its parameters, flat: to embed in a statement."""
    columns = tuple(rows[0])
    sql, is_json = _insert_sql(table, columns, conn.dialect.paramstyle, len(rows))
    return sql, [v for row in _values(rows, columns, is_json) for v in row]


def insert_rows(conn: Connection, table: Table, rows: Rows) -> None:
    """Insert `rows` (dicts with the same keys, named by column) into `table`, as `conn.execute(table.insert(),
    rows)` would: columns left out take their database default."""
    columns = tuple(rows[0])
    sql, is_json = _insert_sql(table, columns, conn.dialect.paramstyle)
    params = _values(rows, columns, is_json)
    with driver_cursor(conn, sql) as cursor:
        if len(params) == 1:
            cursor.execute(sql, params[0])
        else:
            cursor.executemany(sql, params)


def insert_with_parents(conn: Connection, parents: Table, parent_rows: Rows, table: Table, rows: Rows) -> None:
    """Insert `parent_rows` into `parents` and `rows`, which refer to them, into `table`.

    On PostgreSQL that is one statement, the parents' INSERT in a WITH clause (its foreign keys are
    checked at the statement's end, when both are in): one round trip, and one statement for the
    server to run, where two INSERTs cost two. SQLite has no INSERT in WITH, and nothing to gain
    from it in-process: two statements there.
    """
    if conn.dialect.name != "postgresql":
        insert_rows(conn, parents, parent_rows)
        insert_rows(conn, table, rows)
        return
    head, head_params = _insert_values(conn, parents, parent_rows)
    tail, params = _insert_values(conn, table, rows)
    sql = f"WITH new_{parents.name} AS ({head}) {tail}"
    with driver_cursor(conn, sql) as cursor:
        cursor.execute(sql, head_params + params)


def insert_rows_and_execute(conn: Connection, table: Table, rows: Rows, sql: str, params: tuple[Any, ...]) -> int:
    """Insert `rows` into `table` and run `sql` (an UPDATE or a DELETE written with `?` placeholders);
    the number of rows `sql` matched.

    On PostgreSQL that is one statement: `sql` in a WITH clause, what it matched counted in the INSERT's
    RETURNING; SQLite has no UPDATE in WITH: two statements there.
    """
    if conn.dialect.name != "postgresql":
        insert_rows(conn, table, rows)
        return execute(conn, sql, params)
    insert, values = _insert_values(conn, table, rows)
    statement = f"WITH matched AS ({_native(sql, conn.dialect.paramstyle)} RETURNING 1) {insert}"
    statement += " RETURNING (SELECT count(*) FROM matched)"
    with driver_cursor(conn, statement) as cursor:
        cursor.execute(statement, [*params, *values])
        return cursor.fetchone()[0]


def execute(conn: Connection, sql: str, params: tuple[Any, ...]) -> int:
    """Run one statement written with `?` placeholders; its row count."""
    sql = _native(sql, conn.dialect.paramstyle)
    with driver_cursor(conn, sql) as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@contextlib.contextmanager
def driver_cursor(conn: Connection, statement: str) -> Iterator[Any]:
    """A cursor of `conn`'s driver connection whose errors leave as SQLAlchemy's."""
    dbapi = conn.connection.dbapi_connection
    cursor = dbapi.cursor()
    try:
        yield cursor
    except conn.dialect.loaded_dbapi.Error as exc:
        disconnect = conn.dialect.is_disconnect(exc, dbapi, cursor)
        if disconnect:
            conn.invalidate(exc)
        raise sa_exc.DBAPIError.instance(
            statement,
            None,
            exc,
            conn.dialect.loaded_dbapi.Error,
            connection_invalidated=disconnect,
            dialect=conn.dialect,
        ) from exc
    finally:
        with contextlib.suppress(Exception):  # a cursor of a dead connection may fail to close
            cursor.close()
