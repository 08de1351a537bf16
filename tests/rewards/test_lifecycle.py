"""The session lifecycle around rewards: idle sessions expire as failed with their data
kept, and every misuse of `/finish` and `/reward` is a 4xx in OpenAI's error shape.

(open → finished → consumed: claiming is the trainer's, and is tested there.)
"""

from __future__ import annotations

import time

import openai
import pytest


def client_for(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)


def one_turn(session: dict, max_tokens: int = 2) -> str:
    r = client_for(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Say hi."}], max_tokens=max_tokens
    )
    return r.id


def assert_error(r, status: int, param: str | None = None, text: str = "") -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == {400: "invalid_request_error", 404: "not_found_error", 409: "conflict_error"}[status]
    if param is not None:
        assert error["param"] == param
    assert text in error["message"]


# -- expiry (on `expiring_proxy`: a 2 s timeout would close other tests' sessions) ------------


def test_idle_session_expires_as_failed_with_its_completions(expiring_proxy):
    proxy = expiring_proxy
    session = proxy.new_session(task_id="idle")
    sid = session["session_id"]
    completion = one_turn(session)
    before = proxy.session(sid)["completions"]

    # idle for 2 s, then found by the sweeper, which runs every max(1, 2 / 4) = 1 s
    deadline = time.monotonic() + 30
    while proxy.session(sid)["status"] == "open" and time.monotonic() < deadline:
        time.sleep(0.5)
    after = proxy.session(sid)
    assert after["status"] == "failed"
    assert after["failure"] == "timed out: no activity for 2s"
    assert after["finished_at"] is not None and after["reward"] is None
    assert after["completions"] == before, "the episode's tokens are kept"
    [node] = before
    assert node["id"] == completion and node["output_ids"] and node["prompt_ids"]

    listed = proxy.get("/sessions", params={"status": "failed"}).json()["data"]
    assert sid in {s["session_id"] for s in listed}
    with pytest.raises(openai.ConflictError, match="failed"):
        one_turn(session)
    assert_error(proxy.post(f"/sessions/{sid}/finish", json={"reward": 1.0}), 409, text="already failed")
    assert_error(proxy.post(f"/sessions/{sid}/reward", json={"reward": 1.0}), 409, text="is failed")


def test_a_call_longer_than_the_timeout_is_activity(expiring_proxy):
    """A session whose one call generates for several times the 2 s timeout is not closed under it
    (its turn would be refused and the generation lost): the sweeper counts a call in flight as
    activity, and the turn is recorded."""
    session = expiring_proxy.new_session(task_id="long call")
    started = time.monotonic()
    r = client_for(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Count."}], max_tokens=200, extra_body={"ignore_eos": True}
    )
    took = time.monotonic() - started
    assert r.usage.completion_tokens == 200
    [node] = expiring_proxy.session(session["session_id"])["completions"]
    assert node["id"] == r.id and len(node["output_ids"]) == 200, f"after {took:.1f} s"


# -- misuse, on both stores ---------------------------------------------------------------------


def test_finish_with_both_reward_and_reward_fn_is_400(proxy):
    session = proxy.new_session(task_id="both")
    sid = session["session_id"]
    r = proxy.post(f"/sessions/{sid}/finish", json={"reward": 1.0, "reward_fn": "math_exact", "reference": "2"})
    assert_error(r, 400, "reward_fn", "not both")
    assert proxy.session(sid)["status"] == "open", "a refused finish changes nothing"


def test_finish_with_neither_and_no_default_is_400(proxy):
    sid = proxy.new_session(task_id="neither")["session_id"]
    assert_error(proxy.post(f"/sessions/{sid}/finish"), 400, "reward", "needs a reward or a reward_fn")
    assert_error(proxy.post(f"/sessions/{sid}/finish", json={}), 400, "reward")
    assert proxy.session(sid)["status"] == "open"


def test_unknown_reward_fn_is_400(proxy):
    assert_error(proxy.post("/sessions", json={"reward_fn": "no_such_reward"}), 400, "reward_fn", "no_such_reward")
    sid = proxy.new_session(task_id="unknown-fn")["session_id"]
    r = proxy.post(f"/sessions/{sid}/finish", json={"reward_fn": "no_such_reward"})
    assert_error(r, 400, "reward_fn", "unknown reward function 'no_such_reward'")
    assert "math_exact" in r.json()["error"]["message"], "the message lists what is registered"
    assert proxy.session(sid)["status"] == "open"


def test_reward_on_unknown_completion_or_session_is_404(proxy):
    session = proxy.new_session(task_id="unknown-completion")
    sid = session["session_id"]
    one_turn(session)
    r = proxy.post(f"/sessions/{sid}/reward", json={"reward": 1.0, "completion_id": "chatcmpl-nope"})
    assert_error(r, 404, "completion_id", "chatcmpl-nope")
    assert_error(proxy.post("/sessions/sess_nope/reward", json={"reward": 1.0}), 404, "session_id")
    assert_error(proxy.post("/sessions/sess_nope/finish", json={"reward": 1.0}), 404, "session_id")
    # a completion of another session is just as unknown here
    other = proxy.new_session(task_id="other")
    foreign = one_turn(other)
    assert_error(proxy.post(f"/sessions/{sid}/reward", json={"reward": 1.0, "completion_id": foreign}), 404)
    assert proxy.session(other["session_id"])["completions"][0]["reward"] is None


def test_reward_on_finished_session_is_409(proxy):
    session = proxy.new_session(task_id="finished")
    sid = session["session_id"]
    completion = one_turn(session)
    posted = proxy.post(f"/sessions/{sid}/reward", json={"reward": 0.5})
    assert posted.status_code == 200 and posted.json()["completion_id"] == completion
    done = proxy.post(f"/sessions/{sid}/finish", json={"reward": 1.0})
    assert done.status_code == 200 and done.json()["status"] == "finished"
    r = proxy.post(f"/sessions/{sid}/reward", json={"reward": 2.0, "completion_id": completion})
    assert_error(r, 409, text="is finished")
    [node] = proxy.session(sid)["completions"]
    assert node["reward"] == 1.5, "0.5 posted + 1.0 at finish, untouched by the refused post"


def test_finish_is_idempotent_and_a_different_finish_conflicts(proxy):
    session = proxy.new_session(task_id="twice", reward_fn="regex_match", reference=".")
    sid = session["session_id"]
    one_turn(session, max_tokens=4)
    first = proxy.post(f"/sessions/{sid}/finish")
    assert first.status_code == 200 and first.json()["status"] == "finished", first.text
    again = proxy.post(f"/sessions/{sid}/finish", json={"reward_fn": "regex_match"})
    assert again.status_code == 200 and again.json() == first.json(), "the same finish answers the same result"
    assert_error(proxy.post(f"/sessions/{sid}/finish", json={"reward": 0.0}), 409, text="already finished")
    r = proxy.post(f"/sessions/{sid}/finish", json={"reward_fn": "regex_match", "reference": "x"})
    assert_error(r, 409, text="conflicts")
