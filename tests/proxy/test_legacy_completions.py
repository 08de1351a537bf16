"""The real `openai` client's legacy `completions.create` against a real `areal-proxy serve`.

Text and token-id prompts, streamed and not, logprobs, stop strings, echo, `n`, vLLM's
`return_token_ids`; every call recorded as a root of its session's tree (api "completions") with
the exact ids, and exported by `areal-proxy export` with them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import sqlalchemy as sa

from trainer.export import read_file

CLI = str(Path(sys.executable).with_name("areal-proxy"))
PROMPT = "The first five prime numbers are 2, 3,"
IDS = {"return_token_ids": True}


def client_for(proxy, session: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)


def greedy(client: openai.OpenAI, prompt, **kw) -> dict:
    r = client.completions.create(model="m", prompt=prompt, max_tokens=12, temperature=0, extra_body=IDS, **kw)
    return r.to_dict()


def test_text_prompt_answer_logprobs_and_record(proxy):
    session = proxy.new_session()
    r = greedy(client_for(proxy, session), PROMPT, logprobs=2)
    assert r["object"] == "text_completion" and r["id"].startswith("cmpl-") and r["model"] == "m"
    [choice] = r["choices"]
    assert choice["text"] and choice["finish_reason"] in ("stop", "length")
    ids = choice["token_ids"]
    assert r["usage"] == {
        "prompt_tokens": len(r["prompt_token_ids"]),
        "completion_tokens": len(ids),
        "total_tokens": len(r["prompt_token_ids"]) + len(ids),
    }
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(ids)
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert "".join(lp["tokens"]).startswith(choice["text"])
    for token, logprob, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[token] == logprob and 1 <= len(top) <= 3 and logprob <= 0
    [node] = proxy.session(session["session_id"])["completions"]
    assert node["id"] == r["id"] and node["api"] == "completions" and node["parent_id"] is None
    assert node["messages"] == []
    assert node["prompt_ids"] == r["prompt_token_ids"] and node["output_ids"] == ids
    assert node["output_logprobs"] == pytest.approx(lp["token_logprobs"], abs=1e-6)
    assert node["sampling"]["max_tokens"] == 12
    with sa.create_engine(proxy.db_url).connect() as conn:
        request = conn.execute(sa.text("SELECT request FROM completions WHERE id = :i"), {"i": r["id"]}).scalar_one()
    request = request if isinstance(request, dict) else json.loads(request)
    assert request["prompt"] == PROMPT and request["messages"] == []


def test_token_id_prompt_is_used_as_given(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    by_text = greedy(client, PROMPT)
    ids = by_text["prompt_token_ids"]
    by_ids = greedy(client, ids)
    wrapped = greedy(client, [ids])  # a batch of one
    assert by_ids["prompt_token_ids"] == wrapped["prompt_token_ids"] == ids
    assert by_ids["choices"][0]["token_ids"] == by_text["choices"][0]["token_ids"] == wrapped["choices"][0]["token_ids"]
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]
    nodes = proxy.session(session["session_id"])["completions"]
    assert [n["prompt_ids"] for n in nodes] == [ids] * 3
    assert all(n["parent_id"] is None for n in nodes), "a legacy completion is a root"


def test_streaming_matches_the_answer_and_the_record(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    whole = greedy(client, PROMPT, logprobs=1)
    stream = client.completions.create(
        model="m", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=1, stream=True, extra_body=IDS
    )
    texts, ids, tokens, finish, usage, prompt_ids = [], [], [], None, None, None
    for chunk in stream:
        c = chunk.to_dict()
        assert c["object"] == "text_completion"
        prompt_ids = c.get("prompt_token_ids", prompt_ids)
        usage = c.get("usage") or usage
        for choice in c["choices"]:
            texts.append(choice["text"])
            ids += choice["token_ids"]
            tokens += (choice["logprobs"] or {}).get("tokens", [])
            finish = choice["finish_reason"] or finish
    assert sum(1 for t in texts if t) > 3, "text must arrive as separate chunks"
    assert "".join(texts) == whole["choices"][0]["text"]
    assert ids == whole["choices"][0]["token_ids"] and tokens == whole["choices"][0]["logprobs"]["tokens"]
    assert prompt_ids == whole["prompt_token_ids"] and finish == whole["choices"][0]["finish_reason"]
    assert usage == whole["usage"]
    streamed = proxy.session(session["session_id"])["completions"][-1]
    assert streamed["output_ids"] == ids and streamed["prompt_ids"] == prompt_ids


def test_stop_echo_and_n(proxy):
    session = proxy.new_session()
    client = client_for(proxy, session)
    text = greedy(client, PROMPT)["choices"][0]["text"]
    stop = text[len(text) // 2 :][:3]
    cut = greedy(client, PROMPT, stop=[stop])["choices"][0]
    assert cut["text"] == text[: text.index(stop)] and cut["finish_reason"] == "stop"
    echoed = greedy(client, PROMPT, echo=True)["choices"][0]
    assert echoed["text"] == PROMPT + text
    stream = client.completions.create(model="m", prompt=PROMPT, max_tokens=12, temperature=0, echo=True, stream=True)
    assert "".join(c.text for chunk in stream for c in chunk.choices) == PROMPT + text
    many = client.completions.create(model="m", prompt=PROMPT, max_tokens=6, n=2, seed=7, temperature=1.0)
    assert [c.index for c in many.choices] == [0, 1]
    nodes = proxy.session(session["session_id"])["completions"]
    assert sorted(n["choice_index"] for n in nodes if n["response_id"] == many.id) == [0, 1]


def test_export_gives_back_the_exact_ids(proxy, tmp_path):
    session = proxy.new_session()
    ids = [504, 2365, 282, 4649, 314]
    r = greedy(client_for(proxy, session), ids)
    assert proxy.post(f"/sessions/{session['session_id']}/finish", json={"reward": 1.0}).status_code == 200
    out = tmp_path / "samples.jsonl"
    done = subprocess.run(
        [CLI, "export", "--db", proxy.db_url, "--out", str(out)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    [sample] = [s for s in read_file(str(out)) if s["session_id"] == session["session_id"]]
    assert sample["prompt_ids"] == ids and sample["output_ids"] == r["choices"][0]["token_ids"]
    assert sample["completion_id"] == r["id"] and sample["return"] == 1.0


BAD = [
    ({"max_tokens": 2}, 400, "prompt"),
    ({"prompt": ""}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [[]]}, 400, "prompt"),
    ({"prompt": ["a", "b"]}, 400, "prompt"),
    ({"prompt": 5}, 400, "prompt"),
    ({"prompt": [1, "a"]}, 400, "prompt[1]"),
    ({"prompt": [1, -1]}, 400, "prompt[1]"),
    ({"prompt": [1, 10**6]}, 400, "prompt"),
    ({"prompt": "hi", "n": 64}, 400, "n"),
    ({"prompt": "hi", "max_tokens": 10**6}, 422, "max_tokens"),
    ({"prompt": [1] * 9000}, 422, "prompt"),
    ({"prompt": "hi", "logprobs": True}, 400, "logprobs"),
    ({"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "hi", "echo": True, "logprobs": 1}, 400, "echo"),
    ({"prompt": "hi", "best_of": 3}, 400, "best_of"),
    ({"prompt": "hi", "suffix": "end"}, 400, "suffix"),
    ({"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
]


def test_bad_requests_are_4xx_in_openai_shape(sqlite_proxy):
    session = sqlite_proxy.new_session()
    for body, status, param in BAD:
        r = httpx.post(f"{session['base_url']}/completions", json={"model": "m", **body}, timeout=60)
        assert r.status_code == status, (body, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["param"] == param, (body, error)
    assert sqlite_proxy.session(session["session_id"])["completions"] == []
    with pytest.raises(openai.BadRequestError):
        client_for(sqlite_proxy, session).completions.create(model="m", prompt=["one", "two"])
