"""GSM8K end to end: an agent loop with the real `openai` client, scored by `math_exact`
at finish, then exported with `areal-proxy export` and checked token for token.

Eight test problems run concurrently, one session each, created with the problem's
reference answer and `reward_fn: math_exact`; each episode asks, then asks for only
the final number, then finishes with an empty body (the defaults from creation).
The exported samples (individual and concat, JSONL and Parquet) must carry exactly
the token ids, logprobs, versions and returns stored for those sessions.
"""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from rewards.extract import extract_answer_number, numbers_equal
from trainer.export import read_file

CLI = str(Path(sys.executable).with_name("areal-proxy"))
PROBLEMS = 8
SYSTEM = {"role": "system", "content": "You are a careful math tutor. Solve the problem step by step."}


def load_problems(gsm8k_dir: Path) -> list[dict]:
    with open(gsm8k_dir / "test.jsonl") as f:
        rows = [json.loads(line) for _, line in zip(range(PROBLEMS), f)]
    return [
        {"question": r["question"], "reference": r["answer"].split("####")[-1].strip().replace(",", "")} for r in rows
    ]


def episode(proxy, index: int, problem: dict) -> str:
    """One agent episode: ask, ask for only the number, finish with the creation defaults."""
    session = proxy.new_session(task_id=f"gsm8k-test-{index}", reward_fn="math_exact", reference=problem["reference"])
    client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    messages = [SYSTEM, {"role": "user", "content": problem["question"]}]
    for question, max_tokens in [(None, 24), ("Give only the final number.", 8)]:
        if question:
            messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, seed=index)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    done = proxy.post(f"/sessions/{session['session_id']}/finish")
    assert done.status_code == 200, done.text
    return session["session_id"]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def gsm8k_run(request: pytest.FixtureRequest, gsm8k_dir: Path) -> tuple:
    """(server, {session id: GET /sessions/{id}}, problems) after eight finished episodes."""
    proxy = request.getfixturevalue(f"{'sqlite' if request.param == 'sqlite' else 'pg'}_proxy")
    problems = load_problems(gsm8k_dir)
    with concurrent.futures.ThreadPoolExecutor(PROBLEMS) as pool:
        sids = list(pool.map(lambda args: episode(proxy, *args), enumerate(problems)))
    return proxy, {sid: proxy.session(sid) for sid in sids}, problems


def test_each_episode_is_finished_and_scored(gsm8k_run):
    _, stored, problems = gsm8k_run
    for (sid, session), problem in zip(stored.items(), problems):
        assert session["status"] == "finished" and session["failure"] is None, sid
        assert session["reward"] in (0.0, 1.0)
        assert session["reward_fn"] == "math_exact" and session["reference"] == problem["reference"]
        first, second = session["completions"]
        assert second["parent_id"] == first["id"], "the second turn continues the first"
        assert second["prompt_ids"][: len(first["prompt_ids"]) + len(first["output_ids"])] == (
            first["prompt_ids"] + first["output_ids"]
        )
        # math_exact grades the last reply; its score lands on the last completion
        right = numbers_equal(extract_answer_number(second["response"]["content"] or ""), problem["reference"])
        assert session["reward"] == (1.0 if right else 0.0)
        assert second["reward"] == session["reward"] and first["reward"] is None
        assert second["return"] == session["reward"]
        assert first["return"] is not None and 0.0 <= first["return"] <= second["return"]


def export(proxy, out: Path, style: str) -> list[dict]:
    done = subprocess.run(
        [CLI, "export", "--db", proxy.db_url, "--out", str(out), "--style", style],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote ") and f"{style} samples to {out}" in done.stdout
    return read_file(str(out))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_individual_export_matches_the_store(gsm8k_run, tmp_path, suffix):
    proxy, stored, _ = gsm8k_run
    rows = [r for r in export(proxy, tmp_path / f"individual{suffix}", "individual") if r["session_id"] in stored]
    nodes = {n["id"]: (sid, n) for sid, s in stored.items() for n in s["completions"]}
    assert sorted(r["completion_id"] for r in rows) == sorted(nodes), "one sample per completion"
    for row in rows:
        sid, node = nodes[row["completion_id"]]
        assert row["prompt_ids"] == node["prompt_ids"]
        assert row["output_ids"] == node["output_ids"]
        assert row["behav_logprobs"] == node["output_logprobs"]
        assert row["versions"] == node["output_versions"]
        assert row["return"] == node["return"] and row["reward"] == node["reward"]
        assert row["parent_id"] == node["parent_id"] and row["turn"] == node["depth"]
        assert row["session_reward"] == stored[sid]["reward"]
        assert row["task_id"] == row["group_id"] == stored[sid]["task_id"], "the group falls back to the task"


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_concat_export_matches_the_store(gsm8k_run, tmp_path, suffix):
    proxy, stored, _ = gsm8k_run
    rows = [r for r in export(proxy, tmp_path / f"concat{suffix}", "concat") if r["session_id"] in stored]
    assert sorted(r["session_id"] for r in rows) == sorted(stored), "one path per session (each is a chain)"
    for row in rows:
        path = stored[row["session_id"]]["completions"]
        leaf = path[-1]
        assert row["leaf_id"] == leaf["id"] and row["completion_ids"] == [n["id"] for n in path]
        assert row["input_ids"] == leaf["prompt_ids"] + leaf["output_ids"]
        n = len(row["input_ids"])
        assert len(row["loss_mask"]) == len(row["behav_logprobs"]) == len(row["versions"]) == len(row["returns"]) == n
        mask, logprobs, versions, returns = [0] * n, [0.0] * n, [-1] * n, [0.0] * n
        for node in path:  # each turn's sampled tokens sit right after its full prompt
            start = len(node["prompt_ids"])
            span = range(start, start + len(node["output_ids"]))
            assert [row["input_ids"][i] for i in span] == node["output_ids"]
            for i, k in zip(span, range(len(span))):
                mask[i], logprobs[i], versions[i] = 1, node["output_logprobs"][k], node["output_versions"][k]
                returns[i] = node["return"]
        assert row["loss_mask"] == mask
        assert sum(mask) == sum(len(node["output_ids"]) for node in path)
        assert row["behav_logprobs"] == logprobs
        assert row["versions"] == versions
        assert row["returns"] == returns
        assert row["session_reward"] == stored[row["session_id"]]["reward"]
