"""Misbehaving user rewards, loaded with `areal-proxy serve --rewards module.py`.

A reward that raises, overruns `rewards.timeout_s`, or returns something other than a
finite float marks its session `failed` with the reason — visible over HTTP and in
`areal-proxy sessions show` — and never a silent 0.0; the server keeps serving. A
per-turn mapping lands on the completions it names. Registering a name twice fails
loading with a message that names the clash.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

CLI = str(Path(sys.executable).with_name("areal-proxy"))
WIDE = {**os.environ, "COLUMNS": "240"}  # rich wraps at 80 columns when not on a terminal

REWARD_NAMES = [
    "test_bool",
    "test_nan",
    "test_per_turn",
    "test_raises",
    "test_stranger",
    "test_string",
    "test_stuck",
    "test_too_slow",
    "test_too_slow_async",
]  # as registered by the module in conftest.py
FAILURES = {
    "test_raises": "reward test_raises failed: RuntimeError: grader exploded on [/INST]",
    "test_too_slow": "reward test_too_slow timed out after 1s",
    "test_too_slow_async": "reward test_too_slow_async timed out after 1s",
    "test_nan": "reward test_nan failed: ValueError: reward is nan, not a finite number",
    "test_bool": "reward test_bool failed: TypeError: reward must be a float, got bool",
    "test_string": "reward test_string failed: TypeError: reward must be a float, got str",
    "test_stranger": (
        "reward test_stranger failed: ValueError: reward names completion "
        "'chatcmpl-not-in-this-session', which is not in this session"
    ),
}


def client_for(session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)


def one_turn(session: dict, content: str = "Say hi.") -> str:
    r = client_for(session).chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=2
    )
    return r.id


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120, env=WIDE)


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_failing_reward_fails_the_session_with_its_reason(rewards_proxy, name):
    proxy = rewards_proxy
    session = proxy.new_session(task_id=f"fails-{name}")
    sid = session["session_id"]
    completion = one_turn(session)

    started = time.monotonic()
    r = proxy.post(f"/sessions/{sid}/finish", json={"reward_fn": name})
    elapsed = time.monotonic() - started
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "failed" and r.json()["reward"] is None
    assert r.json()["failure"] == FAILURES[name]
    assert elapsed < 5, "a reward past its 1 s timeout (sleeping 6 s) must not hold the finish"

    stored = proxy.session(sid)
    assert stored["status"] == "failed" and stored["failure"] == FAILURES[name] and stored["reward"] is None
    [node] = stored["completions"]
    assert node["id"] == completion and node["output_ids"], "the episode's tokens are kept"
    assert node["reward"] is None and node["return"] is None, "never a silent 0.0"

    again = proxy.post(f"/sessions/{sid}/finish", json={"reward_fn": name})
    assert again.status_code == 200 and again.json() == r.json(), "the same finish answers the same outcome"
    other = proxy.post(f"/sessions/{sid}/finish", json={"reward": 1.0})
    assert other.status_code == 409 and other.json()["error"]["type"] == "conflict_error"

    shown = cli("sessions", "show", sid, "--db", proxy.db_url)
    assert shown.returncode == 0, shown.stderr
    assert f"{sid} status=failed" in shown.stdout
    assert f"failure: {FAILURES[name]}" in flat(shown.stdout)

    fresh = proxy.new_session(task_id="still-serving")
    assert one_turn(fresh, "What is 1+1?").startswith("chatcmpl-"), "the server keeps serving"


def test_stuck_rewards_do_not_starve_the_server(rewards_proxy):
    """Sync rewards that never return keep their threads; reads and model calls must go on."""
    proxy = rewards_proxy
    sids = [proxy.new_session(task_id="stuck")["session_id"] for _ in range(12)]

    def finish(sid: str) -> httpx.Response:
        return httpx.post(f"{proxy.url}/sessions/{sid}/finish", json={"reward_fn": "test_stuck"}, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(len(sids)) as pool:
        outcomes = list(pool.map(finish, sids))
    assert [r.status_code for r in outcomes] == [200] * len(sids)
    assert {r.json()["failure"] for r in outcomes} == {"reward test_stuck timed out after 1s"}

    listed = httpx.get(f"{proxy.url}/sessions", params={"status": "failed"}, timeout=30)
    assert listed.status_code == 200
    session = proxy.new_session(task_id="after-stuck")
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0, timeout=60)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert r.choices[0].message.content is not None


def test_per_turn_mapping_lands_on_its_completions(rewards_proxy):
    proxy = rewards_proxy
    session = proxy.new_session(task_id="per-turn")
    sid = session["session_id"]
    client = client_for(session)
    messages = [{"role": "user", "content": "Name a colour."}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=6)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}]
    messages += [{"role": "user", "content": "Another one?"}]
    second = client.chat.completions.create(model="m", messages=messages, max_tokens=6)
    posted = proxy.post(f"/sessions/{sid}/reward", json={"completion_id": first.id, "reward": 0.5})
    assert posted.status_code == 200, posted.text

    r = proxy.post(f"/sessions/{sid}/finish", json={"reward_fn": "test_per_turn"})
    assert r.status_code == 200, r.text
    # the function gives turn 0 → 1.0 and turn 1 → 2.0; the session's reward is its total
    assert r.json()["status"] == "finished" and r.json()["reward"] == 3.0 and r.json()["failure"] is None
    nodes = {n["id"]: n for n in proxy.session(sid)["completions"]}
    assert nodes[second.id]["parent_id"] == first.id
    # raw: turn 0 = 0.5 posted + 1.0 = 1.5, turn 1 = 2.0 (nothing from the last-turn default)
    assert nodes[first.id]["reward"] == 1.5 and nodes[second.id]["reward"] == 2.0
    # γ = 0.9: G(1) = 2.0, G(0) = 1.5 + 0.9 · 2.0 = 3.3
    assert nodes[second.id]["return"] == pytest.approx(2.0)
    assert nodes[first.id]["return"] == pytest.approx(3.3)


def test_rewards_list_shows_the_module(reward_module):
    listed = cli("rewards", "list", "--rewards", str(reward_module))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.count("│") >= 3}
    assert set(REWARD_NAMES) <= set(rows), listed.stdout
    assert {"math_exact", "regex_match", "format"} <= set(rows), "built-ins are listed too"
    assert "async" in rows["test_per_turn"] and "async" not in rows["test_raises"]
    assert "misbehaving_rewards.per_turn" in rows["test_per_turn"]


DUPLICATE_OF_BUILTIN = """
from rewards import reward


@reward("math_exact")
def my_math(session):
    return 1.0
"""

DUPLICATE_WITHIN = """
from rewards import reward


@reward("twice")
def first(session):
    return 1.0


@reward("twice")
def second(session):
    return 0.0
"""


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (DUPLICATE_OF_BUILTIN, "reward 'math_exact' is already registered by rewards.builtins.math_exact"),
        (DUPLICATE_WITHIN, "reward 'twice' is already registered by _areal_rewards_dup.first"),
    ],
    ids=["builtin", "within-module"],
)
def test_duplicate_reward_name_fails_loading(tmp_path, source, message):
    module = tmp_path / "dup.py"
    module.write_text(source)
    listed = cli("rewards", "list", "--rewards", str(module))
    assert listed.returncode != 0
    assert listed.stderr.strip().splitlines()[-1].endswith(message), listed.stderr

    served = subprocess.run(
        [CLI, "serve", "--rewards", str(module), "--db", f"sqlite:///{tmp_path}/x.db", "--port", "9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode == 2, served.stderr
    assert served.stderr.strip() == f"areal-proxy: cannot load reward modules: {message}"
