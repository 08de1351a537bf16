"""`record_turn` writes on the driver's cursor (`proxy/store/driver.py`), not through SQLAlchemy Core:
what it stores must read back through SQLAlchemy as the Core insert's rows did, on SQLite and
PostgreSQL: JSON of every shape (non-ASCII text, a non-string key, an integer past 64 bits, JSON
null), blobs, booleans, the session's counters and version span, and a closed session's refusal."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from proxy.store.db import Database
from proxy.store.schema import completions
from proxy.store.sessions import get_session, insert_sessions
from proxy.store.tokens import pack_floats, pack_ints, unpack_floats, unpack_ints
from proxy.store.turns import record_turn

AWKWARD_REQUEST = {
    "messages": [{"role": "user", "content": 'naïve café ✓ \u2028 "quoted" \\ back'}],
    "sampling": {"logit_bias": {7: -1.5}, "seed": 2**70},  # json.dumps takes these; orjson does not
    "tools": None,
}


def rows(session_id: str, completion_id: str, n: int = 1, response: object = None) -> list[dict]:
    return [
        {
            "id": f"{completion_id}-{i}" if i else completion_id,
            "session_id": session_id,
            "parent_id": None,
            "response_id": completion_id,
            "choice_index": i,
            "api": "chat",
            "depth": 0,
            "chain_hash": f"h-{completion_id}-{i}",
            "request": AWKWARD_REQUEST,
            "response": response,
            "prompt_ids": pack_ints([1, 2, 3]),
            "prompt_len": 3,
            "output_ids": pack_ints([4, 5 + i]),
            "output_logprobs": pack_floats([-0.5, -0.25]),
            "output_versions": pack_ints([2, 3]),
            "finish_reason": "stop",
            "temperature": 0.7,
            "created_at": time.time(),
            "request_hash": "r" * 64,
        }
        for i in range(n)
    ]


def test_a_new_conversation_reads_back_as_written(db: Database) -> None:
    reply = {"role": "assistant", "content": "ünïcode", "tool_calls": [{"id": "c1", "arguments": "{}"}]}
    assert db.transaction(
        lambda c: record_turn(c, "auto-1", rows("auto-1", "cmpl-1", 2, reply), 100.0, (2, 3), new_auto_session=True)
    )
    stored = db.read(lambda c: c.execute(select(completions).order_by(completions.c.choice_index)).all())
    assert [r.id for r in stored] == ["cmpl-1", "cmpl-1-1"]
    first = stored[0]
    assert first.request == {**AWKWARD_REQUEST, "sampling": {"logit_bias": {"7": -1.5}, "seed": 2**70}}
    assert first.response == reply
    assert unpack_ints(first.prompt_ids) == [1, 2, 3] and unpack_ints(stored[1].output_ids) == [4, 6]
    assert unpack_floats(first.output_logprobs) == [-0.5, -0.25]
    assert (first.temperature, first.reward, first.superseded_by, first.request_hash) == (0.7, None, None, "r" * 64)
    session = db.read(lambda c: get_session(c, "auto-1"))
    assert (session.auto, session.status, session.num_completions) == (True, "open", 2)
    assert (session.min_version, session.max_version, session.metadata, session.eval) == (2, 3, {}, False)
    assert session.created_at == session.updated_at == 100.0


def test_json_null_is_stored_as_json(db: Database) -> None:
    """As SQLAlchemy's JSON type stores None: the JSON `null`, read back as None."""
    db.transaction(lambda c: record_turn(c, "auto-2", rows("auto-2", "cmpl-2"), 1.0, None, new_auto_session=True))
    assert db.read(lambda c: c.execute(select(completions.c.response)).scalar_one()) is None
    session = db.read(lambda c: get_session(c, "auto-2"))
    assert (session.min_version, session.max_version) == (None, None)


@pytest.mark.parametrize("status", ["open", "closed"])
def test_a_named_session_takes_turns_only_while_open(db: Database, status: str) -> None:
    now = time.time()
    row = {"id": "named", "metadata": {}, "status": status, "auto": False, "created_at": now, "updated_at": now}
    db.transaction(lambda c: insert_sessions(c, [row]))
    spans = [(5, 6), (3, 4), (7, 9), None]
    taken = [
        db.transaction(
            lambda c, i=i, s=s: record_turn(c, "named", rows("named", f"t{i}", 2), now + i, s, new_auto_session=False)
        )
        for i, s in enumerate(spans)
    ]
    session = db.read(lambda c: get_session(c, "named"))
    if status == "open":
        assert taken == [True] * 4
        assert (session.num_completions, session.min_version, session.max_version) == (8, 3, 9)
        assert session.updated_at == now + 3
    else:
        assert taken == [False] * 4  # the caller rolls the rows back; the counters are untouched
        assert (session.num_completions, session.min_version, session.max_version) == (0, None, None)
