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

Inside a group commit on PostgreSQL these statements are deferred (`deferring`): queued, then
sent together in psycopg's pipeline mode, with the transaction's BEGIN, and their answers read
back once. A group of k calls then waits for one round trip to the server where it waited for
k + 1, while the server still runs each statement. The statement that also counts a turn into
its session needs its count, which is not known until then: it is taken as matched, and
checked once the pipeline has answered. A count that matched nothing fails the group, and the
writer runs its calls again one by one, each undeferred, so the call concerned is refused as
it always was. Any other statement (a Core one included) sends the queue first, so statements
run in the order they were issued.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
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


class DeferredMismatch(Exception):
    """A deferred statement matched no row where its caller took one as matched (see `deferring`)."""


@dataclass
class _Deferred:
    sql: str
    params: list[Any]
    counted: bool  # returns one row, a count that must not be 0


_QUEUE = "deferred_statements"  # in `conn.info` while `deferring(conn)`: the queued _Deferred


@contextlib.contextmanager
def deferring(conn: Connection, enabled: bool = True) -> Iterator[None]:
    """Queue this module's statements on `conn` (PostgreSQL) and send them together when the block
    ends, or sooner when another statement needs the connection; where pipelining is not available,
    or not `enabled`, they run as they are issued. Leaving the block by an exception drops the queue
    (the transaction is being rolled back)."""
    if not enabled or not _pipelines(conn):
        yield
        return
    conn.info[_QUEUE] = []
    try:
        yield
        flush(conn)
    finally:
        if not conn.invalidated:  # else `info` went with the dead connection; reaching it reconnects
            conn.info.pop(_QUEUE, None)


def pending(conn: Connection) -> int:
    """How many statements are queued on `conn`, not yet sent."""
    return len(conn.info.get(_QUEUE) or ())


def _pipelines(conn: Connection) -> bool:
    return conn.dialect.name == "postgresql" and _libpq_pipelines()


@cache
def _libpq_pipelines() -> bool:
    import psycopg

    return psycopg.Pipeline.is_supported()  # libpq 14 or later


def flush(conn: Connection) -> None:
    """Send the statements queued on `conn` in one pipeline and check what they counted; raises
    `DeferredMismatch` if a counted statement matched nothing."""
    queued = conn.info.get(_QUEUE)
    if not queued:
        return
    batch, queued[:] = list(queued), []
    dbapi = conn.connection.dbapi_connection
    cursors = []
    with _as_sqlalchemy_errors(conn, batch[0].sql, dbapi, None):
        try:
            with dbapi.pipeline():
                for item in batch:
                    cursor = dbapi.cursor()
                    cursors.append(cursor)
                    cursor.execute(item.sql, item.params)
            for item, cursor in zip(batch, cursors, strict=True):
                if item.counted and cursor.fetchone()[0] == 0:
                    raise DeferredMismatch(f"a deferred statement matched no row: {item.sql[:200]}")
        finally:
            for cursor in cursors:
                with contextlib.suppress(Exception):
                    cursor.close()


def _run(conn: Connection, sql: str, params: list[Any], *, counted: bool = False) -> int | None:
    """Run one statement now, or queue it while `deferring`; what it counted (its one row's first
    value) if `counted`, taken as 1 when queued."""
    queued = conn.info.get(_QUEUE)
    if queued is not None:
        queued.append(_Deferred(sql, params, counted))
        return 1 if counted else None
    with driver_cursor(conn, sql) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0] if counted else None


def flush_before_statement(conn: Connection, *_: Any) -> None:
    """`before_cursor_execute` listener of a PostgreSQL engine: a Core statement issued while statements
    are queued runs after them."""
    if conn.info.get(_QUEUE):
        flush(conn)


def _insert_values(conn: Connection, table: Table, rows: Rows) -> tuple[str, list[Any]]:
    """One INSERT of all `rows` (a multi-row VALUES) and its parameters, flat: to embed in a statement."""
    columns = tuple(rows[0])
    sql, is_json = _insert_sql(table, columns, conn.dialect.paramstyle, len(rows))
    return sql, [v for row in _values(rows, columns, is_json) for v in row]


def insert_rows(conn: Connection, table: Table, rows: Rows) -> None:
    """Insert `rows` (dicts with the same keys, named by column) into `table`, as `conn.execute(table.insert(),
    rows)` would: columns left out take their database default."""
    flush(conn)
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
    _run(conn, f"WITH new_{parents.name} AS ({head}) {tail}", head_params + params)


def insert_rows_and_execute(conn: Connection, table: Table, rows: Rows, sql: str, params: tuple[Any, ...]) -> int:
    """Insert `rows` into `table` and run `sql` (an UPDATE or a DELETE written with `?` placeholders);
    the number of rows `sql` matched.

    On PostgreSQL that is one statement: `sql` in a WITH clause, what it matched counted in the INSERT's
    RETURNING; SQLite has no UPDATE in WITH: two statements there. While `deferring`, it is queued,
    taken as matching, and checked when sent.
    """
    if conn.dialect.name != "postgresql":
        insert_rows(conn, table, rows)
        return execute(conn, sql, params)
    insert, values = _insert_values(conn, table, rows)
    statement = f"WITH matched AS ({_native(sql, conn.dialect.paramstyle)} RETURNING 1) {insert}"
    statement += " RETURNING (SELECT count(*) FROM matched)"
    return _run(conn, statement, [*params, *values], counted=True)


def execute(conn: Connection, sql: str, params: tuple[Any, ...]) -> int:
    """Run one statement written with `?` placeholders; its row count."""
    flush(conn)
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
        with _as_sqlalchemy_errors(conn, statement, dbapi, cursor):
            yield cursor
    finally:
        with contextlib.suppress(Exception):  # a cursor of a dead connection may fail to close
            cursor.close()


@contextlib.contextmanager
def _as_sqlalchemy_errors(conn: Connection, statement: str, dbapi: Any, cursor: Any) -> Iterator[None]:
    """The driver's errors raised within, as SQLAlchemy raises them; `conn` invalidated on a disconnect."""
    try:
        yield
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
