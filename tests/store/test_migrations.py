"""Alembic migrations on SQLite and PostgreSQL: a fresh store reaches head with exactly the schema of
`schema.py`; a store written by the pre-Alembic step list upgrades in place and keeps its rows; opening
again is a no-op; a store from a newer release is refused; replicas opening at once migrate once."""

from __future__ import annotations

import re
import threading
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text

from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.migrations import current_revision, head_revision
from proxy.store.schema import Base, completions, sessions
from tests.conftest import fresh_pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/store.db"
    else:
        with fresh_pg_database() as pg_url:
            yield pg_url


def open_store(url: str) -> Database:
    return Database(StoreConfig(url=url))


def schema_drift(db: Database) -> list:
    """Differences between the database and `schema.py`, as Alembic's autogenerate sees them."""
    return db.read(lambda c: compare_metadata(MigrationContext.configure(c), Base.metadata))


def legacy_store(url: str, version: int) -> None:
    """A store as the pre-Alembic step list left it at `version`, with one session and one completion."""
    engine = create_engine(url)
    with engine.begin() as conn:
        # Step 1 of the releases before `seed`: the schema of then (no status index, no seed, no claimed_step,
        # no eval, no temperature, no creation-time indexes, no request hash or resend mark).
        Base.metadata.create_all(conn)
        conn.execute(text("DROP INDEX ix_sessions_status_updated"))
        conn.execute(text("DROP INDEX ix_sessions_claimed_step"))
        # ... and every index over all rows (before 0008: three more, and three of today's partial ones whole)
        for table, column in [("sessions", "task_id"), ("sessions", "group_id"), ("completions", "parent_id")]:
            conn.execute(text(f"DROP INDEX ix_{table}_{column}"))
            conn.execute(text(f"CREATE INDEX ix_{table}_{column} ON {table} ({column})"))
        for column in ("status", "updated_at", "consumed_step"):
            conn.execute(text(f"CREATE INDEX ix_sessions_{column} ON sessions ({column})"))
        conn.execute(text("DROP INDEX ix_sessions_created"))
        conn.execute(text("DROP INDEX ix_sessions_status_created"))
        conn.execute(text("ALTER TABLE sessions DROP COLUMN seed"))
        conn.execute(text("ALTER TABLE sessions DROP COLUMN claimed_step"))
        conn.execute(text("ALTER TABLE sessions DROP COLUMN eval"))
        conn.execute(text("ALTER TABLE sessions DROP COLUMN temperature"))
        conn.execute(text("DROP INDEX ix_completions_request"))
        conn.execute(text("ALTER TABLE completions DROP COLUMN request_hash"))
        conn.execute(text("ALTER TABLE completions DROP COLUMN superseded_by"))
        if version >= 2:
            conn.execute(text("CREATE INDEX IF NOT EXISTS ix_sessions_status_updated ON sessions (status, updated_at)"))
        if version >= 3:
            conn.execute(text("ALTER TABLE sessions ADD COLUMN seed BIGINT"))
        conn.execute(text("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at FLOAT NOT NULL)"))
        for number in range(1, version + 1):
            conn.execute(text("INSERT INTO schema_version VALUES (:v, :t)"), {"v": number, "t": time.time()})
        conn.execute(
            sessions.insert().values(
                id="sess_old", status="finished", auto=False, reward=1.0, created_at=1.0, updated_at=2.0
            )
        )
        conn.execute(  # trained by step 3 of a trainer of then
            sessions.insert().values(
                id="sess_trained", status="consumed", consumed_step=3, auto=False, created_at=1.0, updated_at=2.0
            )
        )
        conn.execute(
            completions.insert().values(
                id="chatcmpl-old",
                session_id="sess_old",
                response_id="chatcmpl-old",
                chain_hash="h",
                request={"messages": [{"role": "user", "content": "hi"}]},
                response={"role": "assistant", "content": "hello"},
                prompt_ids=b"\x01\x00\x00\x00",
                prompt_len=1,
                output_ids=b"\x02\x00\x00\x00",
                output_logprobs=b"\x00\x00\x00\x00",
                output_versions=b"\x00\x00\x00\x00",
                finish_reason="stop",
                reward=1.0,
                created_at=1.5,
            )
        )
    engine.dispose()


def test_a_fresh_store_reaches_head_with_the_schema_of_schema_py(url):
    db = open_store(url)
    try:
        assert db.read(current_revision) == head_revision() == "0008"
        assert schema_drift(db) == []
        assert_sparse_indexes(db)
        assert not db.read(lambda c: inspect(c).has_table("schema_version"))
    finally:
        db.close()


def index_definitions(db: Database) -> dict[str, str]:
    """The store's own indexes (not those of primary keys and unique columns): name → definition."""
    if db.sqlite:
        query = "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    else:
        query = "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
    return dict(db.read(lambda c: c.execute(text(query)).all()))


SPARSE = {
    "ix_sessions_task_id": "task_id",
    "ix_sessions_group_id": "group_id",
    "ix_sessions_claimed_step": "claimed_step",
    "ix_completions_parent_id": "parent_id",
}
UNUSED = ["ix_sessions_status", "ix_sessions_updated_at", "ix_sessions_consumed_step"]


def assert_sparse_indexes(db: Database) -> None:
    """Migration 0008: columns empty on most rows are indexed over the rows that have a value; the indexes
    nothing searched are gone (Alembic's comparison does not look at an index's WHERE)."""
    definitions = index_definitions(db)
    for name, column in SPARSE.items():
        assert re.search(rf"WHERE \(?{column} IS NOT NULL\)?", definitions[name], re.IGNORECASE), definitions[name]
    assert not set(UNUSED) & set(definitions)


@pytest.mark.parametrize(
    ("query", "index"),
    [
        ("SELECT id FROM sessions WHERE group_id = 'g'", "ix_sessions_group_id"),
        ("SELECT id FROM sessions WHERE task_id IN ('a', 'b')", "ix_sessions_task_id"),
        ("SELECT id FROM sessions WHERE claimed_step > 3", "ix_sessions_claimed_step"),
        ("SELECT id FROM completions WHERE parent_id = 'c'", "ix_completions_parent_id"),
    ],
)
def test_a_lookup_by_value_uses_the_partial_index(tmp_path, query, index):
    """SQLite's planner takes a partial index only where the query implies its WHERE: `=`, `IN` and `>`
    on the column do."""
    db = open_store(f"sqlite:///{tmp_path}/store.db")
    try:
        plan = db.read(lambda c: c.execute(text(f"EXPLAIN QUERY PLAN {query}")).all())
        assert f"INDEX {index} (" in " ".join(row[-1] for row in plan), plan  # USING [COVERING] INDEX ...
    finally:
        db.close()


def test_opening_again_is_a_no_op(url):
    open_store(url).close()
    db = open_store(url)
    try:
        db.transaction(lambda c: c.execute(sessions.insert().values(id="s1", created_at=1.0, updated_at=1.0)))
    finally:
        db.close()
    db = open_store(url)
    try:
        assert db.read(current_revision) == head_revision()
        assert db.read(lambda c: c.execute(text("SELECT count(*) FROM alembic_version")).scalar()) == 1
        assert db.read(lambda c: c.execute(text("SELECT id FROM sessions")).scalars().all()) == ["s1"]
    finally:
        db.close()


@pytest.mark.parametrize("version", [2, 3])
def test_a_pre_alembic_store_upgrades_in_place_and_keeps_its_rows(url, version):
    legacy_store(url, version)
    db = open_store(url)
    try:
        assert db.read(current_revision) == head_revision()
        assert schema_drift(db) == []
        assert_sparse_indexes(db)
        assert not db.read(lambda c: inspect(c).has_table("schema_version"))
        session = db.read(lambda c: c.execute(sessions.select().where(sessions.c.id == "sess_old")).one())
        assert (session.id, session.status, session.reward, session.seed) == ("sess_old", "finished", 1.0, None)
        trained = db.read(lambda c: c.execute(sessions.select().where(sessions.c.id == "sess_trained")).one())
        assert trained.claimed_step == 3, "a step's sessions of then were claimed by that step"
        turn = db.read(lambda c: c.execute(completions.select()).one())
        assert (turn.id, turn.response["content"], turn.output_ids) == ("chatcmpl-old", "hello", b"\x02\x00\x00\x00")
    finally:
        db.close()
    open_store(url).close()  # and once more: nothing left to do


def test_a_store_from_a_newer_release_is_refused(url):
    open_store(url).close()
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    with pytest.raises(RuntimeError, match="newer than this areal-proxy"):
        open_store(url)


def test_a_pre_alembic_store_from_a_newer_release_is_refused(url):
    legacy_store(url, 3)
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO schema_version VALUES (4, 0)"))
    engine.dispose()
    with pytest.raises(RuntimeError, match="newer than this areal-proxy"):
        open_store(url)


def test_replicas_opening_a_fresh_postgresql_store_at_once_migrate_it_once():
    with fresh_pg_database() as url:
        errors: list[BaseException] = []

        def replica() -> None:
            try:
                open_store(url).close()
            except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=replica) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        db = open_store(url)
        try:
            assert db.read(current_revision) == head_revision()
            assert schema_drift(db) == []
        finally:
            db.close()
