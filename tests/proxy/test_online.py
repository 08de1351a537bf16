"""Online RL through the real server: feedback by response id, episodes that end when idle, deadlines,
episode headers and resends.

The server runs with `[online] enabled` and short timers: an automatic episode ends after 2 s idle;
rewarded by then it is finished on its feedback (reward = the sum posted, returns over its tree);
unrewarded it waits for the 6 s deadline, then is dropped, or scored by `default_reward_fn` where one
is set. Each test waits for the sweeper by polling the session, never by asserting a time.
"""

from __future__ import annotations

import time
import uuid

import httpx
import pytest
from sqlalchemy import select

from proxy.store.config import StoreConfig
from proxy.store.db import Database
from proxy.store.schema import completions
from tests.conftest import run_server

ONLINE = [
    "--set", "online.enabled=true",
    "--set", "online.idle_timeout_s=2",
    "--set", "online.reward_deadline_s=6",
    "--set", "online.sweep_interval_s=0.2",
    "--set", 'online.labels={"solved" = 1.0, "wrong" = -0.5}',
]  # fmt: skip


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def online(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"online-{request.param}")
    if request.param == "sqlite":
        with run_server(tmp, f"sqlite:///{tmp}/areal.db", *ONLINE) as server:
            yield server
    else:
        from tests.conftest import fresh_pg_database

        with fresh_pg_database() as url, run_server(tmp, url, *ONLINE) as server:
            yield server


def chat(server, messages: list[dict], headers: dict | None = None) -> dict:
    r = httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"Authorization": "Bearer sk-my-app", **(headers or {})},
        json={"model": "m", "messages": messages, "max_tokens": 6, "temperature": 0},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def fresh_question() -> list[dict]:
    return [{"role": "user", "content": f"Say hello to {uuid.uuid4().hex[:8]}."}]


def session_of(server, completion_id: str) -> str:
    """The session a completion was recorded in, read from the store."""
    db = Database(StoreConfig(url=server.db_url))
    try:
        return db.read(
            lambda c: c.execute(select(completions.c.session_id).where(completions.c.id == completion_id)).scalar_one()
        )
    finally:
        db.close()


def wait_status(server, session_id: str, status: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        shown = server.session(session_id)
        if shown["status"] == status or time.monotonic() > deadline:
            assert shown["status"] == status, shown
            return shown
        time.sleep(0.2)


def test_feedback_finishes_an_idle_episode_on_its_reward(online):
    messages = fresh_question()
    first = chat(online, messages)
    r = online.post("/feedback", json={"response_id": first["id"], "thumbs": "up"})
    assert r.status_code == 200, r.text
    assert r.json()["completion_id"] == first["id"] and r.json()["reward"] == 1.0
    shown = wait_status(online, r.json()["session_id"], "finished")
    assert shown["auto"] is True and shown["reward"] == 1.0
    assert shown["completions"][0]["reward"] == 1.0 and shown["completions"][0]["return"] == 1.0


def test_feedback_on_a_turn_reaches_the_earlier_turns_through_returns(online):
    messages = fresh_question()
    first = chat(online, messages)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And again."}]
    second = chat(online, messages)
    r = online.post("/feedback", json={"response_id": second["id"], "label": "solved"})
    assert r.status_code == 200, r.text
    shown = wait_status(online, r.json()["session_id"], "finished")
    by_id = {c["id"]: c for c in shown["completions"]}
    assert set(by_id) == {first["id"], second["id"]}
    assert by_id[second["id"]]["return"] == 1.0 and by_id[first["id"]]["return"] == 1.0  # discount 1
    assert shown["reward"] == 1.0


def test_an_unrated_episode_is_dropped_at_the_deadline(online):
    answer = chat(online, fresh_question())
    shown = wait_status(online, session_of(online, answer["id"]), "failed")
    assert "no feedback within 6s" in shown["failure"]
    late = online.post("/feedback", json={"response_id": answer["id"], "thumbs": "up"})
    assert late.status_code == 409 and "has ended" in late.json()["error"]["message"]


def test_a_conversation_that_goes_on_after_its_episode_ended_starts_a_new_one(online):
    messages = fresh_question()
    first = chat(online, messages)
    old = session_of(online, first["id"])
    assert online.post("/feedback", json={"response_id": first["id"], "score": 0.3}).status_code == 200
    wait_status(online, old, "finished")
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Once more."}]
    second = chat(online, messages)
    new = session_of(online, second["id"])
    assert new != old
    shown = online.session(new)
    assert [c["parent_id"] for c in shown["completions"]] == [None]  # a root, its prompt rendered whole


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"response_id": "chatcmpl-nope", "score": 1}, 404, "response_id"),
        ({"response_id": "x"}, 400, None),
        ({"response_id": "x", "score": 1, "thumbs": "up"}, 400, None),
        ({"response_id": "x", "thumbs": "sideways"}, 400, "thumbs"),
        ({"response_id": "x", "score": "high"}, 400, "score"),
        ({"score": 1}, 400, "response_id"),
    ],
)
def test_bad_feedback_is_a_clear_4xx(online, body, status, param):
    r = online.post("/feedback", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param


def test_an_unknown_label_is_a_400_listing_the_known_ones(online):
    answer = chat(online, fresh_question())
    r = online.post("/feedback", json={"response_id": answer["id"], "label": "meh"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "label"
    assert "solved" in r.json()["error"]["message"] and "wrong" in r.json()["error"]["message"]


def test_an_episode_header_groups_several_conversations_and_ends_with_them(online):
    header = {"X-Areal-Episode": f"user-42-{uuid.uuid4().hex[:6]}"}
    a = chat(online, fresh_question(), header)
    b = chat(online, fresh_question(), header)  # another root, the same episode
    sid = session_of(online, a["id"])
    assert session_of(online, b["id"]) == sid
    r = online.post("/feedback", json={"response_id": b["id"], "score": 0.5})
    assert r.status_code == 200
    shown = wait_status(online, sid, "finished")
    assert {c["id"] for c in shown["completions"]} == {a["id"], b["id"]}
    assert all(c["parent_id"] is None for c in shown["completions"])
    again = chat(online, fresh_question(), header)  # the header's next episode
    assert session_of(online, again["id"]) != sid


def test_a_bad_episode_header_is_a_400(online):
    r = httpx.post(
        f"{online.base_url}/chat/completions",
        headers={"X-Areal-Episode": "x" * 300},
        json={"model": "m", "messages": fresh_question(), "max_tokens": 4},
        timeout=300,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Areal-Episode"


def test_a_resent_first_request_supersedes_the_answer_never_seen(online):
    messages = fresh_question()
    lost = chat(online, messages)  # the client timed out on this one and sent the request again
    kept = chat(online, messages)
    refused = online.post("/feedback", json={"response_id": lost["id"], "thumbs": "up"})
    message = refused.json()["error"]["message"]
    # superseded by `kept`, or already ended as such by the idle sweeper when this machine is slow
    assert refused.status_code == 409 and (kept["id"] in message or "has ended" in message), message
    r = online.post("/feedback", json={"response_id": kept["id"], "thumbs": "up"})
    assert r.status_code == 200
    wait_status(online, r.json()["session_id"], "finished")
    lost_session = session_of(online, lost["id"])
    assert lost_session != r.json()["session_id"]  # each root of unnamed calls is its own episode
    shown = wait_status(online, lost_session, "failed")
    assert "superseded" in shown["failure"] and shown["completions"][0]["superseded_by"] == kept["id"]


def test_a_resent_later_turn_leaves_the_superseded_sibling_out_of_the_returns(online):
    messages = fresh_question()
    first = chat(online, messages)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And again."}]
    lost = chat(online, messages)
    kept = chat(online, messages)
    r = online.post("/feedback", json={"response_id": kept["id"], "score": 0.8})
    assert r.status_code == 200
    shown = wait_status(online, r.json()["session_id"], "finished")
    by_id = {c["id"]: c for c in shown["completions"]}
    assert set(by_id) == {first["id"], lost["id"], kept["id"]}  # recorded, all three
    assert by_id[lost["id"]]["return"] is None  # never trained: out of the tree's returns
    assert by_id[lost["id"]]["superseded_by"] == kept["id"]
    assert by_id[first["id"]]["return"] == pytest.approx(0.8) and shown["reward"] == pytest.approx(0.8)


def test_with_a_default_reward_an_unrated_episode_is_scored_at_the_deadline(tmp_path):
    args = [*ONLINE, "--set", "online.default_reward_fn=format"]
    with run_server(tmp_path, f"sqlite:///{tmp_path}/areal.db", *args) as server:
        answer = chat(server, fresh_question())
        listed = server.get("/sessions", params={"limit": 10}).json()["data"]
        assert len(listed) == 1
        shown = wait_status(server, listed[0]["session_id"], "finished")
        assert shown["reward"] == 0.0 and shown["failure"] is None  # `format`: no answer tags in a greeting
        assert answer["id"] == shown["completions"][0]["id"]
        metrics = server.get("/metrics").text
        assert 'areal_online_episodes_total{outcome="default_reward"} 1' in metrics
