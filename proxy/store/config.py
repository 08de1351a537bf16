"""`[store]`: where the SQL store lives and how the proxy and trainer connect to it.

SQLite (the default, one file, one machine) or PostgreSQL (several processes and hosts);
read by `proxy/store/db.py`, the one place that opens connections. Pydantic only, so the
CLI's `--help` stays instant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.sections import Section


class StoreConfig(Section):
    url: str = "sqlite:///./areal.db"
    """SQLAlchemy URL: sqlite:///path or postgresql+psycopg://user@host/db."""
    pool_size: int = 8
    """Connections kept open (PostgreSQL)."""
    max_overflow: int = 8
    """Extra connections allowed above pool_size under load (PostgreSQL)."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Longest wait for a new connection to the database server before it fails (PostgreSQL)."""
    statement_timeout_s: float = Field(default=30.0, ge=0)
    """A statement running longer than this is cancelled by the server (PostgreSQL; 0: no limit)."""
    commit_batch: int = 256
    """Most completions written in one group commit."""
    sqlite_synchronous: Literal["full", "normal"] = "full"
    """SQLite durability: full fsyncs every commit (survives power loss); normal survives a crash of the
    proxy but not of the machine, and commits faster."""
    sqlite_checkpoint: Literal["background", "inline"] = "background"
    """Who copies SQLite's write-ahead log into the database file. background: a thread of the proxy, every
    `sqlite_checkpoint_s` in which something was committed, without blocking the writer (a PASSIVE
    checkpoint); inline: SQLite's default, the commit that takes the log past 1,000 pages does it, and
    every completion waiting on that commit waits for the copy and its fsync too."""
    sqlite_checkpoint_s: float = Field(default=1.0, gt=0)
    """Seconds between background checkpoints (while something is committed)."""
    sqlite_log_max_mb: float = Field(default=256.0, gt=0)
    """Largest the write-ahead log grows under steady load (background checkpoints). A PASSIVE checkpoint
    copies the log but cannot start it over while readers and the writer keep using it, which under
    steady load they always do: past this size, the writer, between two group commits, waits a few ms for
    the reads in progress and starts it over (a RESTART checkpoint), and the file is cut back to it."""
