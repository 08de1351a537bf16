"""Database access: engine setup, migrations, and group commit.

All writes of a proxy process go through one writer thread that drains its queue
and commits everything waiting in a single transaction (group commit): under
load, one fsync covers many completions, yet no caller is answered before its
own rows are durable. If a grouped transaction fails, its operations are retried
one by one so one bad operation cannot sink the others. Reads use the pool.

SQLite runs in WAL mode with `synchronous=FULL`; one proxy process owns a SQLite
file (a lock file refuses a second one; use PostgreSQL for several replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, create_engine, event
from sqlalchemy.engine import Engine as SAEngine
from sqlalchemy.engine import make_url

from proxy.store.config import StoreConfig
from proxy.store.migrations import migrate

log = logging.getLogger(__name__)
T = TypeVar("T")
WriteOp = Callable[[Connection], Any]


class StoreLocked(RuntimeError):
    """Another proxy process already owns this SQLite database."""


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def create_db_engine(cfg: StoreConfig) -> SAEngine:
    url = make_url(cfg.url)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001
            dbapi_conn.isolation_level = None  # transactions are begun explicitly below
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={cfg.sqlite_synchronous.upper()}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # Writers take the write lock up front: a deferred transaction that reads, then
            # writes after another process committed, fails instead of waiting its turn.
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("write") else "BEGIN")

        return engine
    if url.get_backend_name() == "postgresql" and url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return create_engine(url, pool_size=cfg.pool_size, max_overflow=cfg.max_overflow, pool_pre_ping=True)


class Database:
    """One database: a pooled SQLAlchemy engine plus the group-commit writer."""

    def __init__(self, cfg: StoreConfig, *, owner: bool = False) -> None:
        self.cfg = cfg
        self.engine = create_db_engine(cfg)
        self.sqlite = self.engine.dialect.name == "sqlite"
        self._lock_file: Any = None
        if owner and self.sqlite:
            self._take_sqlite_ownership()
        migrate(self.engine)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self.commits = 0
        self.committed_ops = 0

    # -- ownership ------------------------------------------------------------------
    def _take_sqlite_ownership(self) -> None:
        database = self.engine.url.database
        if not database or database == ":memory:":
            return
        path = Path(database).expanduser().resolve()
        self._lock_file = open(f"{path}.proxy-lock", "a+")  # noqa: SIM115 - held for the process life
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise StoreLocked(
                f"another areal-proxy process is serving the SQLite database {path}. SQLite supports one "
                "proxy process; run several replicas against PostgreSQL "
                "(--db postgresql+psycopg://user@host/db), or give this one its own --db."
            ) from None
        self._lock_file.seek(0)
        self._lock_file.truncate()
        self._lock_file.write(str(os.getpid()))
        self._lock_file.flush()

    # -- reads ----------------------------------------------------------------------
    def read(self, fn: Callable[[Connection], T]) -> T:
        with self.engine.connect() as conn:
            return fn(conn)

    async def aread(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.to_thread(self.read, fn)

    def transaction(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` in its own write transaction on the calling thread (CLI tools, trainer)."""
        with self._write_connection() as conn, conn.begin():
            return fn(conn)

    @contextlib.contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            conn.info["write"] = True
            try:
                yield conn
            finally:
                conn.info.pop("write", None)

    # -- writes -----------------------------------------------------------------------
    def start_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="store-writer", daemon=True)
            self._writer.start()

    def stop_writer(self) -> None:
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(30)
            self._writer = None

    async def write(self, op: WriteOp) -> Any:
        """Run `op(conn)` in the next group commit; return its result once durable."""
        if self._writer is None:
            return await asyncio.to_thread(self.transaction, op)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((op, loop, future))
        return await future

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < self.cfg.commit_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._commit(batch)
                    return
                batch.append(nxt)
            self._commit(batch)

    def _commit(self, batch: list[tuple[WriteOp, asyncio.AbstractEventLoop, asyncio.Future]]) -> None:
        try:
            with self._write_connection() as conn, conn.begin():
                results = [op(conn) for op, _, _ in batch]
            outcomes: list[tuple[Any, BaseException | None]] = [(r, None) for r in results]
        except Exception:
            if len(batch) == 1:
                outcomes = [self._run_alone(batch[0][0])]
            else:
                outcomes = [self._run_alone(op) for op, _, _ in batch]
        self.commits += 1
        self.committed_ops += len(batch)
        for (_, loop, future), (result, error) in zip(batch, outcomes):
            loop.call_soon_threadsafe(_settle, future, result, error)

    def _run_alone(self, op: WriteOp) -> tuple[Any, BaseException | None]:
        for attempt in range(3):
            try:
                with self._write_connection() as conn, conn.begin():
                    return op(conn), None
            except Exception as exc:  # recorded per operation; transient locks retried
                if attempt == 2 or not _is_transient(exc):
                    return None, exc
                time.sleep(0.05 * (attempt + 1))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.stop_writer()
        self.engine.dispose()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def _is_transient(exc: Exception) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "deadlock" in text or "could not serialize" in text


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
