"""Database access: engine setup, migrations, group commit, and what a failing database raises.

All writes of a proxy process go through one writer thread that drains its queue
and commits everything waiting in a single transaction (group commit): under
load, one fsync covers many completions, yet no caller is answered before its
own rows are durable. If a grouped transaction fails, its operations are retried
one by one so one bad operation cannot sink the others. Reads use the pool.

A database that is down, full, partitioned or too slow raises `StoreUnavailable`
(the app answers 503 + Retry-After) within the `[store]` timeouts, never a hang;
the pool drops dead connections, so service resumes by itself once it is back.
A COMMIT cut off with its connection may or may not have landed: a write that says
how to tell (`recorded`) is checked and, if absent, written again, so a stored row
is never reported as failed, nor stored twice.

SQLite runs in WAL mode with `synchronous=FULL`; one proxy process owns a SQLite
file (a lock file refuses a second one; use PostgreSQL for several replicas). The
writer's commits never checkpoint the log themselves: a checkpointer thread copies
it into the database file beside them (`[store] sqlite_checkpoint`), so no group of
completions waits on that copy and its fsync.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from sqlalchemy import Connection, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.engine import Engine as SAEngine

from proxy.store.config import StoreConfig
from proxy.store.driver import deferring, flush_before_statement
from proxy.store.migrations import migrate

log = logging.getLogger(__name__)
T = TypeVar("T")
WriteOp = Callable[[Connection], Any]
Recorded = Callable[[Connection], bool]
Outcome = tuple[Any, BaseException | None]


KEEP_CONNECTION_S = 1.0
"""How long the writer keeps its connection idle before handing it back to the pool (and its ping)."""
BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite statement waits for a lock another connection holds."""
RESTART_WAIT_MS = 50
"""How long the writer waits for the reads in progress when it starts SQLite's log over (`Checkpointer`)."""


class StoreLocked(RuntimeError):
    """Another proxy process already owns this SQLite database."""


class StoreUnavailable(RuntimeError):
    """The database cannot be reached or is failing (down, full, partitioned, timed out): nothing is
    wrong with the request, and the same call can succeed once the database is back."""


class _CommitLost(StoreUnavailable):
    """The database failed during COMMIT: the transaction may or may not be stored."""


UNAVAILABLE = "the store's database cannot be reached or is failing; retry later"
UNKNOWN = (
    "the store's database stopped answering while committing this call and has not come back: "
    "whether it was recorded is unknown; retry later"
)


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
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # Writers take the write lock up front: a deferred transaction that reads, then
            # writes after another process committed, fails instead of waiting its turn.
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.get("write") else "BEGIN")

        return engine
    if url.get_backend_name() == "postgresql" and url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    engine = create_engine(
        url,
        pool_size=cfg.pool_size,
        max_overflow=cfg.max_overflow,
        pool_pre_ping=True,
        connect_args=_postgres_settings(cfg, url),
    )
    answer_s = cfg.statement_timeout_s + cfg.connect_timeout_s if cfg.statement_timeout_s else None
    event.listen(engine, "before_cursor_execute", flush_before_statement)

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect, _record, cargs, cparams) -> _BoundedConnection:  # noqa: ANN001
        conn = _BoundedConnection.connect(*cargs, **cparams)
        conn.answer_timeout_s = answer_s
        return conn

    return engine


def _postgres_settings(cfg: StoreConfig, url: URL) -> dict[str, Any]:
    """libpq settings under which a dead, full or unreachable server fails a call instead of hanging it.

    `connect_timeout` bounds a new connection; keepalives and `tcp_user_timeout` make the kernel drop
    a connection whose peer vanished; the server cancels statements past `statement_timeout` and ends
    a session left idle inside a transaction (its client cut off) so that its locks are released.
    Settings named in the URL win; its `options` are kept.
    """
    connect = max(2, math.ceil(cfg.connect_timeout_s))  # whole seconds, at least 2, as libpq takes them
    settings: dict[str, Any] = {
        "connect_timeout": connect,
        "keepalives": 1,
        "keepalives_idle": connect,
        "keepalives_interval": connect,
        "keepalives_count": 3,
        "tcp_user_timeout": 4 * connect * 1000,
    }
    settings = {key: value for key, value in settings.items() if key not in url.query}
    if cfg.statement_timeout_s:
        statement_ms = round(cfg.statement_timeout_s * 1000)
        idle_ms = statement_ms + connect * 1000
        ours = f"-c statement_timeout={statement_ms} -c idle_in_transaction_session_timeout={idle_ms}"
        settings["options"] = f"{url.query['options']} {ours}" if "options" in url.query else ours
    return settings


class _BoundedConnection(psycopg.Connection):
    """A psycopg connection whose every wait for the server ends.

    psycopg waits for an answer without limit, and a partitioned or hung server may never close the
    socket (its kernel, or a proxy in between, keeps acknowledging), so one lost answer would hold a
    thread (the writer's, for every caller) forever. Past `answer_timeout_s` (the server's statement
    timeout plus the connect timeout, so the server's own timeout fires first when it can) the
    connection is closed mid-protocol and the call fails; the pool then discards it.
    """

    answer_timeout_s: float | None = None

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if self.answer_timeout_s is None:
            return super().wait(gen, *args, **kwargs)
        try:
            return super().wait(_until(gen, time.monotonic() + self.answer_timeout_s), *args, **kwargs)
        except _NoAnswer:
            self.pgconn.finish()  # the protocol stopped halfway: this connection cannot be used again
            raise psycopg.OperationalError(
                f"the database server did not answer within {self.answer_timeout_s:g}s"
            ) from None


class _NoAnswer(Exception):
    pass


def _until(gen: Generator[Any, Any, T], deadline: float) -> Generator[Any, Any, T]:
    """psycopg's wait generator `gen`, abandoned once `deadline` passes (psycopg resumes it every 0.1 s)."""
    try:
        state = next(gen)
        while True:
            ready = yield state
            if time.monotonic() > deadline:
                raise _NoAnswer
            state = gen.send(ready)
    except StopIteration as done:
        return done.value


# -- failures ---------------------------------------------------------------------------
_SQLITE_FAILING = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_IOERR", "SQLITE_CANTOPEN", "SQLITE_READONLY")
_PG_READ_ONLY = "25006"  # a standby answering while a failover completes


def _is_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database is unreachable or failing, rather than that the operation was wrong."""
    if isinstance(exc, sa_exc.TimeoutError):  # every pooled connection stayed busy past pool_timeout
        return True
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    sqlite_code = getattr(exc.orig, "sqlite_errorname", None)
    if sqlite_code is not None:
        return sqlite_code.startswith(_SQLITE_FAILING)
    # psycopg's OperationalError: connection failures, timeouts, disk full, shutdown, cancelled statements
    return isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError)) or (
        getattr(exc.orig, "sqlstate", None) == _PG_READ_ONLY
    )


def _is_transient(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "database is locked" in text or "deadlock" in text or "could not serialize" in text


def _unavailable(
    cause: BaseException | None, message: str = UNAVAILABLE, kind: type[StoreUnavailable] = StoreUnavailable
) -> StoreUnavailable:
    error = kind(message)
    error.__cause__ = cause
    return error


def _log_unavailable(exc: BaseException) -> None:
    log.warning("store unavailable: %s", (str(exc).splitlines() or [type(exc).__name__])[0])


@contextlib.contextmanager
def _failures_as_unavailable() -> Iterator[None]:
    try:
        yield
    except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
        if not _is_unavailable(exc):
            raise
        _log_unavailable(exc)
        raise _unavailable(exc) from exc


def _unless_recorded(op: WriteOp, recorded: Recorded) -> WriteOp:
    return lambda conn: None if recorded(conn) else op(conn)


class Checkpointer:
    """Copies a SQLite database's write-ahead log into the database file from a thread of its own.

    SQLite's default is to do it inside the commit that takes the log past 1,000 pages: that commit, and
    every completion grouped in it, waits for the copy and the database file's fsync (tens of ms on a
    busy disk: the tail of the latency under load). Here the writer's connections never checkpoint; every
    `every_s` seconds in which something was committed, this thread runs a PASSIVE checkpoint on its own
    connection, which takes no lock a writer waits for: it copies what no reader still needs, and SQLite
    starts the log over once all of it was copied. A proxy that stops leaves the rest to SQLite (the
    last connection to close checkpoints).

    Under steady load "all of it" never happens: a reader still on an older snapshot holds back the copy,
    the writer appends meanwhile, and SQLite starts the log over only when a write begins with all of it
    copied and no reader on it. The log then grows without end (100 MB in a few thousand calls), and
    with it the disk, the shared-memory index each read searches, and recovery after a crash. So when a
    checkpoint finds the log past `log_max_bytes`, it asks the writer (`restart_due`), which calls
    `restart_log` between two group commits: no write is in progress, so it waits only for the reads
    (`RESTART_WAIT_MS` at most), copies what this thread left, and starts the log over; the writer's
    `journal_size_limit` cuts the file back. A read that holds its snapshot longer (an export in another
    process) makes it give up and try again later, at longer and longer intervals."""

    def __init__(self, path: Path, every_s: float, log_max_bytes: int) -> None:
        self.path = path
        self.every_s = every_s
        self.log_max_bytes = log_max_bytes
        self.checkpoints = 0
        self.restarts = 0
        self.restart_due = False  # set by this thread, done by the writer's (`restart_log`)
        self._failed_restarts = 0
        self._next_restart = 0.0  # monotonic time before which no restart is asked for again
        self._dirty = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="store-checkpointer", daemon=True)
        self._thread.start()

    def committed(self) -> None:
        self._dirty = True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def _loop(self) -> None:
        import sqlite3

        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        try:
            page_bytes = conn.execute("PRAGMA page_size").fetchone()[0]
            while not self._stop.wait(self.every_s):
                if not self._dirty:
                    continue
                self._dirty = False
                try:
                    _, log_pages, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.checkpoints += 1
                except sqlite3.Error as exc:  # the next round tries again
                    self._dirty = True
                    log.warning("background checkpoint of %s failed: %s", self.path, exc)
                    continue
                if log_pages * page_bytes > self.log_max_bytes and time.monotonic() >= self._next_restart:
                    self.restart_due = True
        finally:
            conn.close()

    def restart_log(self, conn: Any) -> None:
        """Copy the rest of the log and start it over (a RESTART checkpoint), on the writer's thread between
        two group commits, with its SQLite connection `conn`: nothing waits on a lock but the reads in
        progress, for `RESTART_WAIT_MS` at most."""
        import sqlite3

        self.restart_due = False
        started = time.perf_counter()
        try:
            conn.execute(f"PRAGMA busy_timeout={RESTART_WAIT_MS}")
            try:
                busy, log_pages, copied = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            finally:
                conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:  # the writer goes on: its next statement meets a broken connection
            wait_s = self._back_off()
            log.warning("starting the log of %s over failed (trying again in %.1f s): %s", self.path, wait_s, exc)
            return
        if busy:
            log.info(
                "the log of %s (%d pages, %d copied) could not be started over: a read held it past %d ms; "
                "trying again in %.1f s",
                self.path,
                log_pages,
                copied,
                RESTART_WAIT_MS,
                self._back_off(),
            )
            return
        self.restarts += 1
        self._failed_restarts = 0
        took_ms = (time.perf_counter() - started) * 1e3
        log.debug("started the log of %s over (%d pages) in %.1f ms", self.path, log_pages, took_ms)

    def _back_off(self) -> float:
        """After a failed restart: no new one is asked for until twice as long as after the last failure
        (at most a minute). The seconds until then."""
        self._failed_restarts += 1
        wait_s = min(60.0, self.every_s * 2**self._failed_restarts)
        self._next_restart = time.monotonic() + wait_s
        return wait_s


class Database:
    """One database: a pooled SQLAlchemy engine plus the group-commit writer."""

    def __init__(self, cfg: StoreConfig, *, owner: bool = False) -> None:
        self.cfg = cfg
        self.engine = create_db_engine(cfg)
        self.sqlite = self.engine.dialect.name == "sqlite"
        self._lock_file: Any = None
        if owner and self.sqlite:
            self._take_sqlite_ownership()
        self._migrate()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._checkpointer: Checkpointer | None = None
        self._held: Connection | None = None  # the writer's connection, kept while groups follow each other
        self.commits = 0
        self.committed_ops = 0
        # How long a write whose COMMIT was cut off waits for the database to say whether it landed.
        self._resolve_s = cfg.connect_timeout_s + cfg.statement_timeout_s

    def _migrate(self) -> None:
        if self.sqlite:
            migrate(self.engine)
            return
        # A migration may wait for another replica's, or rewrite a large table: no statement timeout.
        engine = create_db_engine(self.cfg.model_copy(update={"statement_timeout_s": 0.0}))
        try:
            migrate(engine)
        finally:
            engine.dispose()

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
        with _failures_as_unavailable(), self.engine.connect() as conn:
            return fn(conn)

    async def aread(self, fn: Callable[[Connection], T]) -> T:
        return await asyncio.to_thread(self.read, fn)

    def transaction(self, fn: Callable[[Connection], T]) -> T:
        """Run `fn` in its own write transaction on the calling thread (CLI tools, trainer)."""
        with _failures_as_unavailable(), self._write_connection() as conn, conn.begin():
            return fn(conn)

    @contextlib.contextmanager
    def _write_connection(self) -> Iterator[Connection]:
        """A connection to write on. The writer thread keeps the one its last group committed on until
        it has been idle `KEEP_CONNECTION_S` (`_write_loop`): checking it out of the pool again would ping
        the server first, a round trip a group on PostgreSQL. A kept connection found closed is
        replaced (`_transaction`)."""
        writer = threading.current_thread() is self._writer
        conn, self._held = (self._held, None) if writer and self._held is not None else (self.engine.connect(), None)
        done = False
        try:
            conn.info["write"] = True
            if self._checkpointer is not None and not conn.info.get("checkpoints_off"):
                # The settings are the connection's: its commits no longer checkpoint, the checkpointer does;
                # a log it started over is cut back to the most it may hold.
                raw = conn.connection.driver_connection
                raw.execute("PRAGMA wal_autocheckpoint=0")
                raw.execute(f"PRAGMA journal_size_limit={self._checkpointer.log_max_bytes}")
                conn.info["checkpoints_off"] = True
            yield conn
            done = True
        finally:
            if done and writer and not conn.invalidated:
                self._held = conn
            else:
                _release(conn)

    def _release_held(self) -> None:
        if self._held is not None:
            conn, self._held = self._held, None
            _release(conn)

    # -- writes -----------------------------------------------------------------------
    def start_writer(self) -> None:
        if self._writer is None:
            database = self.engine.url.database
            if self.sqlite and self.cfg.sqlite_checkpoint == "background" and database and database != ":memory:":
                self._checkpointer = Checkpointer(
                    Path(database).expanduser(), self.cfg.sqlite_checkpoint_s, int(self.cfg.sqlite_log_max_mb * 2**20)
                )
                self._checkpointer.start()
            self._writer = threading.Thread(target=self._write_loop, name="store-writer", daemon=True)
            self._writer.start()

    def stop_writer(self) -> None:
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(30)
            self._writer = None
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None

    async def write(self, op: WriteOp, *, recorded: Recorded | None = None) -> Any:
        """Run `op(conn)` in the next group commit; return its result once durable.

        `recorded(conn)` says whether `op` is already stored. If the database fails during COMMIT,
        it is asked once the database answers again: True settles the call (with None: the result
        is lost with the connection), False runs `op` again. A write without it fails then with
        `StoreUnavailable`, its outcome unknown.
        """
        if self._writer is None:
            result, error = await asyncio.to_thread(self._run_alone, op, recorded)
            if error is not None:
                raise error
            return result
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((op, recorded, loop, future))
        return await future

    def _write_loop(self) -> None:
        try:
            self._write_until_stopped()
        finally:
            self._release_held()

    def _write_until_stopped(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=KEEP_CONNECTION_S) if self._held is not None else self._queue.get()
            except queue.Empty:  # idle: the connection goes back, to be pinged when next taken
                self._release_held()
                continue
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
            if self._checkpointer is not None and self._checkpointer.restart_due and self._held is not None:
                self._checkpointer.restart_log(self._held.connection.driver_connection)

    def _commit(self, batch: list[tuple[WriteOp, Recorded | None, asyncio.AbstractEventLoop, asyncio.Future]]) -> None:
        items = [(op, recorded) for op, recorded, _, _ in batch]
        try:
            results = self._transaction([op for op, _ in items])
            outcomes: list[Outcome] = [(r, None) for r in results]
        except _CommitLost:
            outcomes = self._each_alone(items, lost=True)
        except StoreUnavailable as exc:  # nothing was stored, and nothing will be until it is back
            outcomes = [(None, _unavailable(exc.__cause__ or exc)) for _ in batch]
        except Exception:
            outcomes = self._each_alone(items)
        self.commits += 1
        self.committed_ops += len(batch)
        for (_, _, loop, future), (result, error) in zip(batch, outcomes):
            with contextlib.suppress(RuntimeError):  # its event loop has closed: nobody is waiting
                loop.call_soon_threadsafe(_settle, future, result, error)

    def _transaction(self, ops: list[WriteOp]) -> list[Any]:
        """Run `ops` in one write transaction. A failing database raises `StoreUnavailable`, or
        `_CommitLost` when it failed during COMMIT; a transient conflict is raised as it is.

        The writer's kept connection is not pinged (see `_write_connection`): if it turns out to have
        been closed meanwhile (the server restarted, or an administrator ended it) before anything was
        committed, `ops` run once more on a new connection, which the pool pings first."""
        kept = self._held is not None and threading.current_thread() is self._writer
        committing = False
        try:
            with self._write_connection() as conn, conn.begin():
                with deferring(conn, enabled=len(ops) > 1):  # alone, an operation runs as written
                    results = [op(conn) for op in ops]
                committing = True  # whatever fails from here on, the COMMIT may have landed
            if self._checkpointer is not None:
                self._checkpointer.committed()
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            if kept and not committing and getattr(exc, "connection_invalidated", False):
                return self._transaction(ops)  # the kept connection was released: this one is new
            if not _is_unavailable(exc) or _is_transient(exc):
                raise
            _log_unavailable(exc)
            raise _unavailable(exc, kind=_CommitLost if committing else StoreUnavailable) from exc
        return results

    def _each_alone(self, items: list[tuple[WriteOp, Recorded | None]], *, lost: bool = False) -> list[Outcome]:
        """Run each operation in its own transaction; `lost`: their grouped COMMIT was cut off."""
        deadline = time.monotonic() + self._resolve_s
        outcomes: list[Outcome] = []
        down: BaseException | None = None  # the database did not answer: the rest are not tried
        for op, recorded in items:
            if down is not None:
                outcomes.append((None, _unavailable(down, UNKNOWN if lost else UNAVAILABLE)))
                continue
            result, error = self._run_alone(op, recorded, lost=lost, deadline=deadline)
            if isinstance(error, StoreUnavailable) and (recorded is not None or not lost):
                down = error.__cause__ or error
            outcomes.append((result, error))
        return outcomes

    def _run_alone(
        self, op: WriteOp, recorded: Recorded | None, *, lost: bool = False, deadline: float | None = None
    ) -> Outcome:
        """Run one operation in its own transaction, retrying transient conflicts. Once a COMMIT of
        it is lost (`lost`), ask `recorded` first, and keep asking until `deadline` while the
        database does not answer."""
        deadline = time.monotonic() + self._resolve_s if deadline is None else deadline
        attempt = 0
        while True:
            if lost and recorded is None:
                return None, _unavailable(None, UNKNOWN)
            try:
                return self._transaction([_unless_recorded(op, recorded) if lost else op])[0], None
            except StoreUnavailable as exc:
                lost = lost or isinstance(exc, _CommitLost)
                if not lost:
                    return None, exc
                if recorded is None or time.monotonic() >= deadline:
                    return None, _unavailable(exc.__cause__ or exc, UNKNOWN)
            except Exception as exc:  # recorded per operation; transient conflicts retried
                if not _is_transient(exc):
                    return None, exc
                if attempt >= 2:
                    return None, _unavailable(exc, UNKNOWN if lost else UNAVAILABLE)
            attempt += 1
            time.sleep(min(1.0, 0.05 * 2**attempt))

    def close(self) -> None:
        self.stop_writer()
        self.engine.dispose()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def _release(conn: Connection) -> None:
    """Give a write connection back to the pool."""
    if not conn.invalidated:  # else `info` went with the dead connection; reaching it reconnects
        conn.info.pop("write", None)
    conn.close()


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
