"""Evaluation sessions through the real server: a forced temperature, listing, bad input, admission.

An evaluation session is created with `eval: true` and, optionally, a `temperature` every call of it
samples with, whatever the agent's call asks: the recorded turns carry that temperature, and a forced
0 answers exactly as a greedy call does. Admission control, which holds back training sessions while
the trainer is behind, never refuses or counts evaluation ones.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import run_server

MESSAGES = [{"role": "user", "content": "What is 23 + 45?"}]


def _chat(server, session: dict, temperature: float) -> dict:
    r = httpx.post(
        f"{session['base_url']}/chat/completions",
        headers={"Authorization": f"Bearer {session['api_key']}"},
        json={"model": "m", "messages": MESSAGES, "max_tokens": 12, "temperature": temperature},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_a_forced_temperature_overrides_the_call_and_is_recorded(proxy):
    forced = proxy.new_session(eval=True, temperature=0)
    greedy = proxy.new_session()
    answer = _chat(proxy, forced, 1.7)["choices"][0]["message"]["content"]
    assert answer == _chat(proxy, greedy, 0)["choices"][0]["message"]["content"]
    shown = proxy.session(forced["session_id"])
    assert shown["eval"] is True and shown["temperature"] == 0
    assert [n["temperature"] for n in shown["completions"]] == [0]
    plain = proxy.session(greedy["session_id"])
    assert plain["eval"] is False and plain["temperature"] is None


def test_sessions_list_by_evaluation_flag(proxy):
    made = proxy.new_session(eval=True, task_id="listed-eval")
    listed = proxy.get("/sessions", params={"eval": "true", "limit": 10000}).json()["data"]
    assert made["session_id"] in {s["session_id"] for s in listed}
    assert all(s["eval"] for s in listed)
    training = proxy.get("/sessions", params={"eval": "false", "limit": 10000}).json()["data"]
    assert made["session_id"] not in {s["session_id"] for s in training}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"eval": True, "temperature": 2.5}, "temperature"),
        ({"eval": "maybe"}, "eval"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_bad_evaluation_fields_are_a_400_naming_them(proxy, body, param):
    r = proxy.post("/sessions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_admission_control_never_holds_back_evaluation_sessions(tmp_path):
    settings = ["proxy.admission=true", "trainer.batch.size=2", "rollout.group_size=2", "trainer.max_staleness=0"]
    args = [a for s in settings for a in ("--set", s)]
    with run_server(tmp_path, f"sqlite:///{tmp_path}/areal.db", *args) as server:
        assert server.post("/sessions", json={"count": 2}).status_code == 201
        assert server.post("/sessions", json={"count": 2}).status_code == 429  # the trainer is behind
        assert server.post("/sessions", json={"count": 4, "eval": True}).status_code == 201
        assert server.post("/sessions", json={"count": 1, "eval": True, "temperature": 0}).status_code == 201
        assert server.post("/sessions", json={"count": 1}).status_code == 429  # still 2 training sessions ahead
