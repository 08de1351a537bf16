"""A failing database answers, it does not hang: reads and writes raise `StoreUnavailable` within
the `[store]` timeouts, the writer lives on and service resumes by itself once the database is back.
A COMMIT cut off with its connection is resolved by completion id: answered as committed if it
landed, written again if it did not, never stored twice.

PostgreSQL is reached through `Relay`, which the tests cut and restore (the machine's server stays
up); on SQLite the commit itself is made to fail.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import event, func, select

from proxy.store.config import StoreConfig
from proxy.store.db import UNKNOWN, Database, StoreUnavailable
from proxy.store.schema import completions
from proxy.store.sessions import get_session, insert_sessions
from proxy.store.tokens import pack_floats, pack_ints
from proxy.store.turns import record_turn, turn_recorded
from tests.conftest import fresh_pg_database
from tests.store.relay import Relay

FAST = {"connect_timeout_s": 2.0, "statement_timeout_s": 2.0}
"""A reply not come in 4 s is lost; a connection not made in 2 s fails."""
BOUND_S = 15.0
"""Well over what those timeouts allow a failing call (about 6 s), far under a hang."""
SESSION = "sess_faults"


def open_store(url: str) -> Database:
    db = Database(StoreConfig(url=url, **FAST))
    now = time.time()
    row = {"id": SESSION, "status": "open", "auto": False, "metadata": {}, "created_at": now, "updated_at": now}
    db.transaction(lambda c: insert_sessions(c, [row]))
    return db


def turn(completion_id: str) -> list[dict]:
    """The row of a one-choice call, as `CompletionService.record` writes it."""
    return [
        {
            "id": completion_id,
            "session_id": SESSION,
            "parent_id": None,
            "response_id": completion_id,
            "choice_index": 0,
            "api": "chat",
            "depth": 0,
            "chain_hash": completion_id,
            "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"role": "assistant", "content": "hello"},
            "prompt_ids": pack_ints([1, 2, 3]),
            "prompt_len": 3,
            "output_ids": pack_ints([4, 5]),
            "output_logprobs": pack_floats([-0.5, -0.25]),
            "output_versions": pack_ints([0, 0]),
            "finish_reason": "stop",
            "temperature": 1.0,
            "created_at": time.time(),
        }
    ]


async def record(db: Database, completion_id: str) -> None:
    rows = turn(completion_id)
    done = await db.write(
        lambda c: record_turn(c, SESSION, rows, time.time(), None, new_auto_session=False),
        recorded=lambda c: turn_recorded(c, completion_id),
    )
    assert done in (True, None)  # None: its commit was cut off, and it had landed


def stored(db: Database) -> tuple[dict[str, int], int]:
    """completion id → rows with that id, and the session's completion counter."""
    query = select(completions.c.id, func.count()).group_by(completions.c.id)
    counts = dict(db.read(lambda c: c.execute(query).all()))
    return counts, db.read(lambda c: get_session(c, SESSION)).num_completions


def record_all(db: Database, ids: list[str]) -> None:
    """Record `ids` as one group commit: a first write holds the writer until all are queued."""
    gate, holding = threading.Event(), threading.Event()

    async def main() -> None:
        db.start_writer()
        held = asyncio.ensure_future(db.write(lambda c: (holding.set(), gate.wait(10))))
        assert await asyncio.to_thread(holding.wait, 60), "the writer took the holding write"
        writes = [asyncio.ensure_future(record(db, i)) for i in ids]
        await asyncio.sleep(0.1)
        gate.set()
        await held
        await asyncio.gather(*writes)

    asyncio.run(main())


def at_commit(db: Database, number: int, fault: Callable[[], None]) -> None:
    """Call `fault` just before the engine's `number`-th COMMIT from now."""
    seen = 0

    def hook(_conn) -> None:  # noqa: ANN001
        nonlocal seen
        seen += 1
        if seen == number:
            fault()

    event.listen(db.engine, "commit", hook)


@pytest.fixture
def pg():
    with fresh_pg_database() as url, Relay(url) as relay:
        db = open_store(relay.url)
        try:
            yield db, relay
        finally:
            db.close()


@pytest.mark.parametrize("fault", ["answers_lost", "partition"])
def test_a_group_commit_cut_off_is_resolved_by_completion_id(pg, fault):
    """`answers_lost`: the COMMIT lands, its reply never comes; `partition`: the COMMIT never arrives.
    Either way every caller is answered as recorded, and each row is stored once."""
    db, relay = pg

    def cut() -> None:
        getattr(relay, fault)()
        # back once the reply is given up on (4 s), before the check for it is (4 s more)
        threading.Timer(5.0, relay.restore).start()

    at_commit(db, 2, cut)  # the first COMMIT is the gate's, the second the five turns'
    ids = [f"chatcmpl-cut-{fault}-{i}" for i in range(5)]
    started = time.monotonic()
    record_all(db, ids)
    assert time.monotonic() - started < BOUND_S
    counts, num_completions = stored(db)
    assert counts == dict.fromkeys(ids, 1)
    assert num_completions == 5, "the session's counter was not applied twice"


@pytest.mark.parametrize("fault", ["down", "partition"])
def test_a_failing_database_fails_fast_and_service_resumes(pg, fault):
    db, relay = pg
    asyncio.run(record_first(db))
    getattr(relay, fault)()
    for attempt in ("read", "write", "write again"):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            if attempt == "read":
                db.read(lambda c: get_session(c, SESSION))
            else:
                asyncio.run(record(db, f"chatcmpl-lost-{fault}-{attempt[-1]}"))
        assert time.monotonic() - started < BOUND_S, attempt
    relay.restore()
    asyncio.run(record(db, "chatcmpl-after"))
    counts, num_completions = stored(db)
    assert counts == {"chatcmpl-before": 1, "chatcmpl-after": 1}
    assert num_completions == 2


async def record_first(db: Database) -> None:
    db.start_writer()
    await record(db, "chatcmpl-before")


def lose_next_commit(monkeypatch: pytest.MonkeyPatch, db: Database, *, lands: bool) -> None:
    """The next COMMIT fails as a lost connection does, after it was applied if `lands`."""
    dialect = db.engine.dialect
    real = dialect.do_commit

    def do_commit(dbapi_conn) -> None:  # noqa: ANN001
        monkeypatch.setattr(dialect, "do_commit", real)
        if lands:
            real(dbapi_conn)
        raise dialect.loaded_dbapi.OperationalError("disk I/O error")

    monkeypatch.setattr(dialect, "do_commit", do_commit)


@pytest.mark.parametrize("lands", [True, False])
def test_a_commit_that_raises_is_resolved_on_sqlite(tmp_path, monkeypatch, lands):
    db = open_store(f"sqlite:///{tmp_path}/store.db")
    try:
        asyncio.run(record_first(db))
        lose_next_commit(monkeypatch, db, lands=lands)
        asyncio.run(record(db, "chatcmpl-raised"))
        counts, num_completions = stored(db)
        assert counts == {"chatcmpl-before": 1, "chatcmpl-raised": 1}
        assert num_completions == 2
    finally:
        db.close()


def test_a_write_that_cannot_be_checked_is_reported_unknown(tmp_path, monkeypatch):
    """Without `recorded` a cut-off COMMIT is neither reported as failed nor run again."""
    db = open_store(f"sqlite:///{tmp_path}/store.db")
    try:
        db.start_writer()
        lose_next_commit(monkeypatch, db, lands=True)
        rows = turn("chatcmpl-unchecked")

        async def unchecked() -> None:
            await db.write(lambda c: record_turn(c, SESSION, rows, time.time(), None, new_auto_session=False))

        with pytest.raises(StoreUnavailable) as raised:
            asyncio.run(unchecked())
        assert str(raised.value) == UNKNOWN
        assert stored(db) == ({"chatcmpl-unchecked": 1}, 1)
    finally:
        db.close()
