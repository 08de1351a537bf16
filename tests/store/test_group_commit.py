"""A group commit's calls are told, and store, what committing them one by one would give.

On PostgreSQL the group's recording statements are queued and sent as one pipeline when the calls
have run (`proxy/store/driver.py`, `deferring`); a turn into an existing session is taken as
counted until its answer is read back. These tests queue several writes behind one that holds the
writer, so that they commit as one group, and check: statements run in the order they were issued
(a Core statement between them sees what came before it), a turn whose session no longer takes it
is refused to its own caller while the rest are stored, a failing statement fails only its call,
and the writer's connection goes back to the pool once it is idle; kept between groups without a
ping, a connection the server has closed meanwhile is replaced and the group runs again. On SQLite
nothing is queued and the same outcomes hold.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from sqlalchemy import Connection, event, func, select
from sqlalchemy import exc as sa_exc

from proxy.errors import APIError, conflict
from proxy.store import db as store_db
from proxy.store.db import Database
from proxy.store.driver import pending
from proxy.store.schema import completions
from proxy.store.sessions import auto_session_row, close_session, get_session, insert_sessions
from proxy.store.turns import record_turn
from tests.conftest import PG_ADMIN_URL
from tests.store.test_record_turn import rows


def new_conversation(session_id: str, completion_id: str, n: int = 1) -> Callable[[Connection], bool]:
    turn = rows(session_id, completion_id, n)
    return lambda c: record_turn(c, session_id, turn, time.time(), (1, 1), new_auto_session=True)


def next_turn(session_id: str, completion_id: str) -> Callable[[Connection], bool]:
    """A turn into an existing session, refused as `CompletionService` refuses it when the session is closed."""

    def op(c: Connection) -> bool:
        if not record_turn(c, session_id, rows(session_id, completion_id), time.time(), (1, 1), new_auto_session=False):
            raise conflict(f"session {session_id} was closed while this call ran")
        return True

    return op


def as_one_group(db: Database, ops: list[Callable[[Connection], Any]]) -> tuple[list[Any], int]:
    """Each op's result or exception, with `ops` queued behind a write that holds the writer so that they
    commit together; and how many transactions committed after that write."""
    gate, holding = threading.Event(), threading.Event()
    commits = 0

    def count(_conn: Connection) -> None:
        nonlocal commits
        commits += 1

    async def main() -> list[Any]:
        db.start_writer()
        held = asyncio.ensure_future(db.write(lambda c: (holding.set(), gate.wait(10))))
        assert await asyncio.to_thread(holding.wait, 60), "the writer took the holding write"
        writes = [asyncio.ensure_future(db.write(op)) for op in ops]
        await asyncio.sleep(0.1)
        await asyncio.to_thread(event.listen, db.engine, "commit", count)
        gate.set()
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        await held
        return outcomes

    try:
        outcomes = asyncio.run(main())
    finally:
        event.remove(db.engine, "commit", count)
    return outcomes, commits - 1  # the holding write's own commit


def num_completions(db: Database, session_id: str) -> int:
    return db.read(lambda c: get_session(c, session_id)).num_completions


def stored_ids(db: Database) -> list[str]:
    return db.read(lambda c: sorted(c.execute(select(completions.c.id)).scalars()))


def test_statements_run_in_the_order_issued(db: Database) -> None:
    """A Core statement between queued ones sees them, and a turn into a session created earlier in the
    same group is counted into it: the whole group in one transaction."""
    seen: dict[str, int] = {}

    def look(c: Connection) -> None:
        seen["queued"] = pending(c)
        seen["rows"] = c.execute(select(func.count()).select_from(completions)).scalar_one()

    ops = [
        new_conversation("auto-a", "cmpl-a", n=2),
        look,
        next_turn("auto-a", "cmpl-b"),
        new_conversation("auto-c", "cmpl-c"),
    ]
    outcomes, commits = as_one_group(db, ops)
    assert outcomes == [True, None, True, True]
    assert seen == {"queued": 1 if db.engine.dialect.name == "postgresql" else 0, "rows": 2}
    assert commits == 1  # one group, not run again one by one
    assert stored_ids(db) == ["cmpl-a", "cmpl-a-1", "cmpl-b", "cmpl-c"]
    assert num_completions(db, "auto-a") == 3
    assert num_completions(db, "auto-c") == 1


def test_a_turn_into_a_closed_session_is_refused_to_its_caller_alone(db: Database) -> None:
    now = time.time()
    named = [{**auto_session_row(name, now), "auto": False} for name in ("open", "closing")]
    db.transaction(lambda c: insert_sessions(c, named))
    db.transaction(lambda c: record_turn(c, "auto-old", rows("auto-old", "cmpl-old"), now, None, new_auto_session=True))

    def close(c: Connection) -> None:
        close_session(c, "closing", status="finished", now=time.time())

    ops = [
        new_conversation("auto-1", "cmpl-1"),
        next_turn("open", "cmpl-2"),
        close,
        next_turn("closing", "cmpl-3"),  # issued after the close, in the same group
        next_turn("auto-old", "cmpl-4"),
        new_conversation("auto-5", "cmpl-5"),
    ]
    outcomes, _ = as_one_group(db, ops)
    refused = outcomes.pop(3)
    assert outcomes == [True, True, None, True, True]
    assert isinstance(refused, APIError) and refused.status == 409
    assert stored_ids(db) == ["cmpl-1", "cmpl-2", "cmpl-4", "cmpl-5", "cmpl-old"]
    counts = {name: num_completions(db, name) for name in ("auto-1", "open", "closing", "auto-old", "auto-5")}
    assert counts == {"auto-1": 1, "open": 1, "closing": 0, "auto-old": 2, "auto-5": 1}


def test_a_failing_statement_fails_only_its_call(db: Database) -> None:
    ops = [
        new_conversation("auto-1", "cmpl-1"),
        new_conversation("auto-2", "cmpl-1"),  # the same completion id again
        new_conversation("auto-3", "cmpl-3"),
    ]
    outcomes, _ = as_one_group(db, ops)
    assert outcomes[0] is True and outcomes[2] is True
    assert isinstance(outcomes[1], sa_exc.IntegrityError)
    assert stored_ids(db) == ["cmpl-1", "cmpl-3"]
    assert db.read(lambda c: get_session(c, "auto-2")) is None  # its session went with it


@pytest.mark.parametrize("db", ["postgres"], indirect=True)
def test_the_writer_keeps_its_connection_while_busy_and_gives_it_back_when_idle(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_db, "KEEP_CONNECTION_S", 3.0)
    checkouts = 0

    def checkout(*_: Any) -> None:
        nonlocal checkouts
        checkouts += 1

    event.listen(db.engine.pool, "checkout", checkout)
    try:
        for n in range(3):  # groups one after the other: the connection taken (and pinged) once
            as_one_group(db, [new_conversation(f"auto-{n}-{i}", f"cmpl-{n}-{i}") for i in range(3)])
    finally:
        event.remove(db.engine.pool, "checkout", checkout)
    assert checkouts == 1
    assert db.engine.pool.checkedout() == 1
    deadline = time.monotonic() + 10
    while db.engine.pool.checkedout() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert db.engine.pool.checkedout() == 0


@pytest.mark.parametrize("db", ["postgres"], indirect=True)
def test_a_kept_connection_the_server_closed_is_replaced(db: Database) -> None:
    """The second group starts on the connection the first committed on (more was waiting), whose
    server process is ended just then: its calls are recorded on a new connection, not failed."""
    begins = 0

    def end_its_server_process(conn: Connection) -> None:
        nonlocal begins
        begins += 1
        if begins == 2:
            pid = conn.connection.dbapi_connection.info.backend_pid
            with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
                while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                    time.sleep(0.01)

    event.listen(db.engine, "begin", end_its_server_process)
    try:
        outcomes, _ = as_one_group(db, [new_conversation(f"auto-{i}", f"cmpl-{i}") for i in range(3)])
    finally:
        event.remove(db.engine, "begin", end_its_server_process)
    assert outcomes == [True, True, True]
    assert begins == 3  # the holding write's group, the group on the ended connection, the group again
    assert stored_ids(db) == ["cmpl-0", "cmpl-1", "cmpl-2"]
