"""SQLite's write-ahead log is copied into the database file by the checkpointer thread, never by a
group commit: the writer's connections have automatic checkpoints off, the log is emptied beside
them, and everything written is there after the proxy's store closes and reopens. Under steady reads
and writes, which never leave the log unused, the writer starts it over once it passes its limit."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import completions
from tests.store.test_store_faults import open_store, record


def write_many(db: Database, n: int) -> None:
    async def main() -> None:
        db.start_writer()
        await asyncio.gather(*(record(db, f"c{i}") for i in range(n)))

    asyncio.run(main())


def rows_in_database_file(path: str, copy: str) -> int:
    """Completions in the database file alone: a copy of it without its log (0 where not even the table
    has been copied in yet)."""
    shutil.copyfile(path, copy)
    with sqlite3.connect(copy) as conn:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'completions'").fetchone():
            return 0
        return conn.execute("SELECT count(*) FROM completions").fetchone()[0]


def test_the_checkpointer_copies_the_log_and_commits_never_do(tmp_path):
    path = f"{tmp_path}/store.db"
    db = open_store(f"sqlite:///{path}")
    db.cfg = db.cfg.model_copy(update={"sqlite_checkpoint_s": 0.2})
    write_many(db, 300)
    checkpointer = db._checkpointer
    assert checkpointer is not None
    with db._write_connection() as conn:  # the writer's connection: SQLite's own checkpoints are off
        assert conn.connection.driver_connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    # the database file alone (no log) holds every row once a round has run after the last commit
    deadline = time.time() + 30
    while (rows := rows_in_database_file(path, f"{tmp_path}/copy.db")) < 300 and time.time() < deadline:
        time.sleep(0.1)
    assert rows == 300 and checkpointer.checkpoints > 0
    db.close()
    assert checkpointer._thread is not None and not checkpointer._thread.is_alive()
    reopened = Database(StoreConfig(url=f"sqlite:///{path}"))
    count = reopened.read(lambda c: c.execute(select(func.count()).select_from(completions)).scalar_one())
    assert count == 300
    reopened.close()


def test_without_the_checkpointer_the_rows_stay_in_the_log(tmp_path):
    """The control: the same writes with SQLite's inline checkpoints stay in the log (under 1,000 pages)."""
    path = f"{tmp_path}/store.db"
    db = open_store(f"sqlite:///{path}")
    db.cfg = db.cfg.model_copy(update={"sqlite_checkpoint": "inline"})
    write_many(db, 300)
    assert db._checkpointer is None
    with db._write_connection() as conn:
        assert conn.connection.driver_connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
    time.sleep(0.5)
    assert rows_in_database_file(path, f"{tmp_path}/copy.db") == 0
    db.close()


@pytest.mark.parametrize("value", [0, -1])
def test_a_checkpoint_interval_must_be_positive(value):
    with pytest.raises(ValueError):
        StoreConfig(sqlite_checkpoint_s=value)


def wal_bytes(path: str) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def write_while_reading(db: Database, path: str, n: int) -> list[int]:
    """`n` writes, one after another, while a reader holds a snapshot 10 ms at a time, 10 ms apart: the
    log is never all copied and unused at once when a write begins, so SQLite never starts it over by
    itself; the writer's restart does, in a gap. The log file's size after each write."""
    stop = threading.Event()

    def read() -> None:
        conn = sqlite3.connect(path, isolation_level=None)
        while not stop.is_set():
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM completions").fetchone()
            time.sleep(0.01)
            conn.execute("COMMIT")
            time.sleep(0.01)
        conn.close()

    sizes: list[int] = []

    async def main() -> None:
        db.start_writer()
        for i in range(n):
            await record(db, f"c{i}")
            sizes.append(wal_bytes(path))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        asyncio.run(main())
    finally:
        stop.set()
        reader.join()
    return sizes


@pytest.mark.parametrize("log_max_mb", [0.25, 1000.0])
def test_under_steady_reads_the_writer_starts_the_log_over_past_its_limit(tmp_path, log_max_mb):
    """With a 0.25 MB limit the log file stays near it and rows keep landing in the database file; the
    control, with a limit never reached, shows that this load alone never lets SQLite start it over."""
    path = f"{tmp_path}/store.db"
    db = open_store(f"sqlite:///{path}")
    db.cfg = db.cfg.model_copy(update={"sqlite_checkpoint_s": 0.05, "sqlite_log_max_mb": log_max_mb})
    sizes = write_while_reading(db, path, 1500)
    checkpointer = db._checkpointer
    assert checkpointer is not None and checkpointer.checkpoints > 5
    if log_max_mb < 1:
        assert checkpointer.restarts > 0
        assert max(sizes[len(sizes) // 2 :]) < 4 * 2**20  # a checkpoint interval's writes past the limit
    else:
        assert checkpointer.restarts == 0
        assert sizes == sorted(sizes) and sizes[-1] > 16 * 2**20  # grew with every write, never cut back
    db.close()
    reopened = Database(StoreConfig(url=f"sqlite:///{path}"))
    count = reopened.read(lambda c: c.execute(select(func.count()).select_from(completions)).scalar_one())
    assert count == 1500
    reopened.close()
