"""`areal-proxy engine` as a real process, checked on SGLang's native wire format."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
import torch
from safetensors.torch import load_file, save_file

from proxy.schemas.engine import SGLangSampling
from proxy.servers.engine import parse_sampling
from tests.conftest import reuse_after_idle

# the chat template around "Tell me about the sea."
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2,
          198, 1, 4093, 198, 31530, 549, 563, 260, 3426, 30, 2, 198, 1, 520, 9531, 198]  # fmt: skip


@pytest.fixture(scope="module")
def engine(tmp_path_factory, engine_runner) -> Iterator:
    with engine_runner(tmp_path_factory.mktemp("engine-server")) as process:
        yield process


def generate(engine, max_new_tokens=8, stream=False, **extra) -> dict:
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 0, **extra.pop("sampling", {})}
    body = {"input_ids": PROMPT, "sampling_params": sampling, "return_logprob": True, "stream": stream, **extra}
    r = engine.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def stream_chunks(engine, body: dict) -> list[dict]:
    with httpx.stream("POST", engine.url + "/generate", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_generate_returns_ids_logprobs_and_versions(engine, reference_model):
    out = generate(engine, max_new_tokens=6, top_logprobs_num=3, rid="req-1", sampling={"ignore_eos": True})
    meta = out["meta_info"]
    assert meta["id"] == "req-1"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == 6 and meta["cached_tokens"] == 0
    assert [e[1] for e in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(e[2] is None and e[0] <= 0 for e in meta["output_token_logprobs"])
    assert meta["weight_version"] == "0" and meta["weight_versions"] == [{"version": "0", "start": 0, "end": 6}]
    assert [len(row) for row in meta["output_top_logprobs"]] == [3] * 6
    assert all(row[0][1] == tok for row, tok in zip(meta["output_top_logprobs"], out["output_ids"]))  # greedy
    # the logprobs are the model's own (greedy reports the untempered distribution)
    with torch.no_grad():
        logits = reference_model(torch.tensor([PROMPT + out["output_ids"]])).logits[0]
    fresh = torch.log_softmax(logits.float(), -1)
    for k, (logprob, tok, _) in enumerate(meta["output_token_logprobs"]):
        assert abs(fresh[len(PROMPT) + k - 1, tok].item() - logprob) < 1e-3


def test_stream_chunks_are_cumulative_and_end_with_done(engine):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True}
    chunks = stream_chunks(engine, body)
    assert len(chunks) >= 2, "one chunk per token"
    for before, after in zip(chunks, chunks[1:]):
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
        assert len(after["output_ids"]) > len(before["output_ids"])
        assert before["meta_info"]["finish_reason"] is None
    for c in chunks:
        meta = c["meta_info"]
        assert [e[1] for e in meta["output_token_logprobs"]] == c["output_ids"]
        assert meta["completion_tokens"] == len(c["output_ids"])
    final = chunks[-1]
    assert final["meta_info"]["finish_reason"] is not None
    whole = generate(engine, max_new_tokens=8)
    assert final["output_ids"] == whole["output_ids"] and final["text"] == whole["text"]


def test_stop_token_stays_in_output_ids_and_leaves_the_text(engine):
    free = generate(engine, max_new_tokens=6, sampling={"ignore_eos": True})["output_ids"]
    k = next(i for i in range(1, len(free)) if free[i] not in free[:i])
    out = generate(engine, max_new_tokens=6, sampling={"stop_token_ids": [free[k]]})
    assert out["output_ids"] == free[: k + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": free[k]}
    kept = generate(engine, max_new_tokens=6, sampling={"stop_token_ids": [free[k]], "no_stop_trim": True})
    assert kept["text"].startswith(out["text"]) and len(kept["text"]) > len(out["text"])


def test_stop_string_is_matched_by_text(engine):
    out = generate(engine, max_new_tokens=16, sampling={"stop": [" "], "ignore_eos": True})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": " "}
    assert " " not in out["text"]
    assert 1 <= len(out["output_ids"]) < 16


def test_length_finish_without_logprobs(engine):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
    out = engine.post("/generate", json=body).json()
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert len(out["output_ids"]) == 3 and "output_token_logprobs" not in out["meta_info"]


def test_sampling_params_follow_sglang_defaults():
    params, text = parse_sampling(None, prompt_len=10, max_context=8192, top_logprobs=0)
    assert params.max_new_tokens == 128 and params.temperature == 1.0 and params.top_k == 0 and params.top_p == 1.0
    assert text == {"skip_special_tokens": True, "no_stop_trim": False}
    params, _ = parse_sampling(SGLangSampling(max_new_tokens=None, top_k=5, stop="x"), 10, 8192, 2)
    assert params.max_new_tokens == 8182 and params.top_k == 5 and params.stop == ("x",) and params.top_logprobs == 2
    assert parse_sampling(SGLangSampling(temperature=0), 10, 8192, 0)[0].greedy


def test_errors_use_sglangs_shape(engine):
    cases = [
        {"input_ids": PROMPT, "sampling_params": {"frobnicate": 1}},
        {"input_ids": PROMPT, "sampling_params": {"top_k": 0}},
        {"input_ids": PROMPT, "sampling_params": {"min_p": 0.3}},
        {"input_ids": [5] * 9000},
        {"input_ids": PROMPT, "text": "both"},
        {"input_ids": [10**9]},
    ]
    for body in cases:
        r = engine.post("/generate", json=body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == 400 and err["type"] == "invalid_request_error" and err["message"]
    r = engine.post("/generate", content=b"{not json")
    assert r.status_code == 400 and "error" in r.json()


def test_model_and_server_info(engine):
    from transformers import AutoTokenizer

    info = engine.get("/model_info").json()
    assert engine.get("/get_model_info").json() == info
    assert info["is_generation"] is True and info["weight_version"] == "0"
    tokenizer = AutoTokenizer.from_pretrained(info["tokenizer_path"])
    assert tokenizer.decode(PROMPT).startswith("<|im_start|>system")
    server = engine.get("/server_info").json()
    assert server["context_length"] == 8192 and server["model_path"] == info["model_path"]
    assert engine.get("/health").status_code == 200
    assert engine.get("/health_generate").status_code == 200


def test_text_input_and_batches(engine):
    r = engine.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and len(r.json()["output_ids"]) <= 2
    body = {"input_ids": [PROMPT, PROMPT[:-3]], "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    answers = engine.post("/generate", json=body).json()
    assert isinstance(answers, list) and len(answers) == 2


async def _stream_tokens(client: httpx.AsyncClient, url: str, body: dict, progress: list[int], i: int) -> dict:
    last: dict = {}
    async with client.stream("POST", url + "/generate", json={**body, "stream": True}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
                progress[i] = len(last["output_ids"])
    return last


def test_pause_holds_requests_and_continue_finishes_them(engine):
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 12, "ignore_eos": True, "temperature": 1.0},
        "return_logprob": True,
    }

    async def main():
        progress = [0] * 4
        async with httpx.AsyncClient(timeout=120) as client:
            running = [asyncio.create_task(_stream_tokens(client, engine.url, body, progress, i)) for i in range(3)]
            while min(progress[:3]) < 3:
                await asyncio.sleep(0.02)
            r = await client.post(engine.url + "/pause_generation", json={"mode": "retract"})
            assert r.json()["status"] == "ok"
            held, steps = list(progress), (await client.get(engine.url + "/health")).json()["steps"]
            late = asyncio.create_task(_stream_tokens(client, engine.url, body, progress, 3))
            await asyncio.sleep(1.0)
            health = (await client.get(engine.url + "/health")).json()
            assert health["paused"] and health["steps"] == steps, "no decode step while paused"
            assert progress[:3] == held[:3] and progress[3] == 0, "nothing generated while paused"
            assert health["running"] + health["waiting"] == 4
            await client.post(engine.url + "/continue_generation", json={})
            return await asyncio.gather(*running, late)

    results = asyncio.run(main())
    for out in results:
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
        assert len(out["meta_info"]["output_token_logprobs"]) == 12


def same_logprobs(a: list, b: list) -> bool:
    """The same tokens with the same logprobs up to float noise: two greedy runs of one model can
    differ in the last digits (batch shapes and CPU kernels change the summation order)."""
    return [row[1:] for row in a] == [row[1:] for row in b] and all(
        abs(x[0] - y[0]) <= 1e-4 for x, y in zip(a, b, strict=True)
    )


def test_update_weights_from_disk_mid_stream(engine, perturbed_weights, original_weights, tmp_path):
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 16, "ignore_eos": True, "temperature": 0},
        "return_logprob": True,
    }
    before = generate(engine, max_new_tokens=4)["meta_info"]["output_token_logprobs"]

    async def main():
        progress = [0] * 2
        async with httpx.AsyncClient(timeout=120) as client:
            running = [asyncio.create_task(_stream_tokens(client, engine.url, body, progress, i)) for i in range(2)]
            while min(progress) < 3:
                await asyncio.sleep(0.02)
            # SGLang's RL sequence; pausing also pins the switch inside the streams
            await client.post(engine.url + "/pause_generation", json={"mode": "in_place"})
            update = {"model_path": str(perturbed_weights), "weight_version": "1"}
            r = await client.post(engine.url + "/update_weights_from_disk", json=update)
            assert r.status_code == 200 and r.json()["success"] is True, r.text
            assert r.json()["num_paused_requests"] == 2
            await client.post(engine.url + "/continue_generation", json={})
            return await asyncio.gather(*running)

    for out in asyncio.run(main()):
        spans = out["meta_info"]["weight_versions"]
        assert [s["version"] for s in spans] == ["0", "1"], spans
        assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] and spans[1]["end"] == 16
        assert out["meta_info"]["weight_version"] == "1"
    assert engine.get("/model_info").json()["weight_version"] == "1"
    after = generate(engine, max_new_tokens=4)
    assert after["meta_info"]["weight_versions"] == [{"version": "1", "start": 0, "end": 4}]
    assert not same_logprobs(after["meta_info"]["output_token_logprobs"], before), "the new weights are in use"

    bad = engine.post("/update_weights_from_disk", json={"model_path": "/nonexistent", "weight_version": "9"})
    assert bad.status_code == 400 and bad.json()["success"] is False
    # weights that do not fit the model are refused whole: nothing of them is loaded
    state = load_file(str(original_weights / "model.safetensors"))
    save_file({**state, "model.extra.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    bad = engine.post("/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "9"})
    assert bad.status_code == 400 and "unexpected" in bad.json()["message"]
    assert engine.get("/model_info").json()["weight_version"] == "1"
    assert same_logprobs(
        generate(engine, max_new_tokens=4)["meta_info"]["output_token_logprobs"],
        after["meta_info"]["output_token_logprobs"],
    )
    # a non-numeric label, then back to the original weights
    r = engine.post("/update_weights_from_disk", json={"model_path": str(original_weights), "weight_version": "step-2"})
    assert r.json()["success"] is True
    again = generate(engine, max_new_tokens=4)
    assert again["meta_info"]["weight_version"] == "step-2"
    assert same_logprobs(again["meta_info"]["output_token_logprobs"], before)


def test_an_idle_kept_alive_connection_is_still_served_after_6_s(engine):
    reuse_after_idle(engine.url, idle_s=6.0)
