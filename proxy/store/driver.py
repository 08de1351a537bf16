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
def _insert_sql(table: Table, columns: tuple[str, ...], paramstyle: str) -> tuple[str, tuple[bool, ...]]:
    """The INSERT for `columns` of `table` in the driver's parameter style, and which columns are JSON."""
    sql = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
    return _native(sql, paramstyle), tuple(isinstance(table.c[name].type, JSON) for name in columns)


def insert_rows(conn: Connection, table: Table, rows: Sequence[dict[str, Any]]) -> None:
    """Insert `rows` (dicts with the same keys, named by column) into `table`, as `conn.execute(table.insert(),
    rows)` would: columns left out take their database default."""
    columns = tuple(rows[0])
    sql, is_json = _insert_sql(table, columns, conn.dialect.paramstyle)
    params = [tuple(_json_text(row[c]) if j else row[c] for c, j in zip(columns, is_json, strict=True)) for row in rows]
    with driver_cursor(conn, sql) as cursor:
        if len(params) == 1:
            cursor.execute(sql, params[0])
        else:
            cursor.executemany(sql, params)


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
