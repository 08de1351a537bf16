"""Routing of the engine server pool, then SGLangEngine and VLLMEngine against canned HTTP servers."""

import asyncio
import json
import socket

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from proxy.engines.base import (
    EngineRequestError,
    EngineUnavailable,
    SamplingParams,
    StreamDelta,
    generate,
    merge_deltas,
)
from proxy.engines.config import EngineConfig
from proxy.engines.pool import ServerError, ServerPool, WeightVersions, decode_event, error_from_body, sse_events
from proxy.engines.sglang import SGLangEngine
from proxy.engines.vllm import VLLMEngine
from tests.conftest import serve_app

A, B, C = "http://a:1", "http://b:1", "http://c:1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_pool(urls=(A, B), **kwargs) -> tuple[ServerPool, Clock]:
    clock = Clock()
    return ServerPool(list(urls), clock=clock, **kwargs), clock


def by_url(pool: ServerPool, url: str):
    return next(s for s in pool.servers if s.url == url)


# ---- routing ----


def test_same_affinity_sticks_to_its_server_even_when_busier():
    pool, _ = make_pool()
    first = pool.pick("session-1")
    first.in_flight = 10
    assert pool.pick("session-1") is first
    assert pool.pick("session-2") is not first


def test_new_affinities_go_to_the_least_busy_server():
    pool, _ = make_pool((A, B, C))
    by_url(pool, A).in_flight = 3
    by_url(pool, B).in_flight = 1
    by_url(pool, C).in_flight = 2
    assert pool.pick("new").url == B
    assert pool.pick(None).url == B


def test_ties_spread_new_affinities_over_the_servers():
    pool, _ = make_pool((A, B, C))
    picked = [pool.pick(f"s{i}").url for i in range(6)]
    assert sorted(picked) == sorted([A, B, C] * 2)
    assert [s["affinities"] for s in pool.stats()] == [2, 2, 2]


def test_failed_server_leaves_rotation_and_comes_back_after_the_delay():
    pool, clock = make_pool(dead_after_s=10.0)
    a = by_url(pool, A)
    pool.mark_failed(a, "ConnectError")
    assert [pool.pick(f"s{i}").url for i in range(3)] == [B, B, B]
    stats = {s["url"]: s for s in pool.stats()}
    assert stats[A]["alive"] is False and stats[A]["failures"] == 1 and stats[A]["retry_in_s"] == 10.0
    assert stats[A]["last_error"] == "ConnectError"
    clock.now += 10.0
    assert a in pool.live()
    assert pool.pick("fresh").url == A  # the least pinned server gets the next conversation


def test_an_affinity_moves_when_its_server_dies_and_stays_moved():
    pool, clock = make_pool(dead_after_s=5.0)
    home = pool.pick("s")
    pool.mark_failed(home, "timeout")
    moved = pool.pick("s")
    assert moved is not home
    clock.now += 5.0
    assert pool.pick("s") is moved


def test_no_live_server_is_unavailable_with_the_reasons():
    pool, _ = make_pool()
    for server in pool.servers:
        pool.mark_failed(server, "ConnectError: refused")
    with pytest.raises(EngineUnavailable, match="no engine server is available.*http://a:1.*refused"):
        pool.pick("s")


def test_affinity_map_is_bounded_lru():
    pool, _ = make_pool(max_affinities=2)
    pool.pick("s1")
    pool.pick("s2")
    pool.pick("s1")  # s1 is now the most recent
    pool.pick("s3")  # evicts s2
    assert sum(s["affinities"] for s in pool.stats()) == 2
    assert set(pool._affinity) == {"s1", "s3"}


# ---- retries ----


def deltas(*token_lists, fail_after: Exception | None = None):
    async def gen():
        for ids in token_lists:
            yield StreamDelta(token_ids=list(ids), logprobs=[-0.1] * len(ids), versions=[0] * len(ids))
        if fail_after is not None:
            raise fail_after

    return gen()


async def drain(stream) -> list[StreamDelta]:
    return [d async for d in stream]


def test_retry_on_another_server_before_the_first_token():
    pool, _ = make_pool(retries=2)
    calls = []

    def open_stream(server):
        calls.append(server.url)
        if server.url == A:
            return deltas(fail_after=ServerError("HTTP 500: boom"))
        return deltas([1, 2], [3])

    out = asyncio.run(drain(pool.stream("s", open_stream)))
    assert calls == [A, B]
    assert [d.token_ids for d in out] == [[1, 2], [3]]
    assert by_url(pool, A).failures == 1 and by_url(pool, A) not in pool.live()
    assert pool.pick("s").url == B  # the conversation moved with the retry
    assert all(s.in_flight == 0 for s in pool.servers)


def test_failure_after_a_token_is_unavailable_and_never_retried():
    pool, _ = make_pool(retries=2)
    calls = []

    def open_stream(server):
        calls.append(server.url)
        return deltas([1], fail_after=ServerError("read timed out"))

    seen = []

    async def consume():
        async for d in pool.stream("s", open_stream):
            seen.append(d)

    with pytest.raises(EngineUnavailable, match="mid-generation.*read timed out"):
        asyncio.run(consume())
    assert len(calls) == 1 and len(seen) == 1
    assert pool.servers[0].in_flight == 0


def test_retries_are_bounded_and_name_every_failure():
    pool, _ = make_pool((A, B, C), retries=1)
    calls = []

    def open_stream(server):
        calls.append(server.url)
        return deltas(fail_after=ServerError(f"down {server.url}"))

    with pytest.raises(EngineUnavailable, match="failed on 2 server"):
        asyncio.run(drain(pool.stream(None, open_stream)))
    assert len(calls) == 2


def test_retries_stop_when_no_other_server_is_alive():
    pool, _ = make_pool((A,), retries=3)

    def open_stream(server):
        return deltas(fail_after=ServerError("refused"))

    with pytest.raises(EngineUnavailable, match="failed on 1 server.*refused"):
        asyncio.run(drain(pool.stream(None, open_stream)))


def test_request_errors_are_neither_retried_nor_held_against_the_server():
    pool, _ = make_pool(retries=2)
    calls = []

    def open_stream(server):
        calls.append(server.url)
        return deltas(fail_after=EngineRequestError("prompt too long"))

    with pytest.raises(EngineRequestError):
        asyncio.run(drain(pool.stream(None, open_stream)))
    assert len(calls) == 1 and len(pool.live()) == 2


def test_busy_server_is_retried_elsewhere_but_stays_in_rotation():
    pool, _ = make_pool(retries=1)

    def open_stream(server):
        if server.url == A:
            return deltas(fail_after=ServerError("busy", dead=False))
        return deltas([1])

    asyncio.run(drain(pool.stream(None, open_stream)))
    assert len(pool.live()) == 2


def test_in_flight_is_released_when_the_consumer_stops_early():
    pool, _ = make_pool()
    closed = []

    async def endless():
        try:
            while True:
                yield StreamDelta(token_ids=[1], logprobs=[-0.1], versions=[0])
        finally:
            closed.append(True)

    async def take_one():
        stream = pool.stream("s", lambda server: endless())
        await anext(stream)
        assert sum(s.in_flight for s in pool.servers) == 1
        await stream.aclose()

    asyncio.run(take_one())
    assert closed == [True]
    assert all(s.in_flight == 0 for s in pool.servers)


def test_on_each_live_takes_failed_servers_out_and_raises():
    pool, _ = make_pool((A, B, C))
    pool.mark_failed(by_url(pool, C), "down")
    done = []

    async def action(server):
        if server.url == B:
            raise EngineRequestError("bad checkpoint")
        done.append(server.url)

    with pytest.raises(EngineUnavailable, match="weight update failed on http://b:1: bad checkpoint"):
        asyncio.run(pool.on_each_live(action, "weight update"))
    assert done == [A]
    assert [s.url for s in pool.live()] == [A]


# ---- shared wire helpers ----


def test_weight_version_labels():
    versions = WeightVersions()
    assert versions.to_int("default") == 0
    assert versions.to_int("3") == 3 and versions.current == 3
    assert versions.to_int("step-x") == 3  # an unknown label is the version current when first seen
    versions.set("step-y", 9)
    assert versions.to_int("step-y") == 9 and versions.to_int(None) == 9
    spans = [{"version": "4", "start": 0, "end": 2}, {"version": "5", "start": 2, "end": 9}]
    assert versions.per_token(spans, "5", start=1, count=3) == [4, 5, 5]


def test_error_bodies():
    assert isinstance(error_from_body({"error": {"message": "bad", "code": 400}}, 200), EngineRequestError)
    assert isinstance(error_from_body({"object": "error", "message": "bad", "code": 400}, 400), EngineRequestError)
    assert isinstance(error_from_body({"success": False, "message": "no such path"}, 400), EngineRequestError)
    err = error_from_body("Internal Server Error", 500)
    assert isinstance(err, ServerError) and err.dead
    busy = error_from_body({"error": {"message": "queue full"}}, 429)
    assert isinstance(busy, ServerError) and not busy.dead


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_sse_events_reads_events_line_by_line(size):
    raw = b'data: {"a": 1}\r\n\r\n: comment\ndata: {"b":\ndata: 2}\n\ndata: ' + b"x" * 70_000 + b"\n\ndata: [DONE]"

    async def chunks():  # however the bytes arrive
        for i in range(0, len(raw), size):
            yield raw[i : i + size]

    async def read():
        return [batch async for batch in sse_events(chunks())]

    batches = asyncio.run(read())
    assert [event for batch in batches for event in batch] == [b'{"a": 1}', b'{"b":\n2}', b"x" * 70_000, b"[DONE]"]
    if size == 1000:  # the events one read completed come together
        assert batches[0] == [b'{"a": 1}', b'{"b":\n2}']
    assert all(batches)


def test_decode_event_takes_what_pythons_json_writes_and_names_a_malformed_one():
    assert decode_event(b'{"meta_info": {"output_token_logprobs": [[-0.5, 7, null]]}}', "u") == {
        "meta_info": {"output_token_logprobs": [[-0.5, 7, None]]}
    }
    assert decode_event(b'{"logprob": -Infinity}', "u") == {"logprob": float("-inf")}  # orjson refuses it
    with pytest.raises(ServerError, match=r"http://e sent a malformed stream event: b'\{\"a\": '"):
        decode_event(b'{"a": ', "http://e")


def test_merged_deltas_are_the_burst_in_order_with_its_last_finish():
    first = StreamDelta(token_ids=[1, 2], logprobs=[-0.1, -0.2], versions=[3, 3])
    second = StreamDelta(token_ids=[4], logprobs=[-0.4], versions=[4], top_logprobs=[[(4, -0.4), (5, -1.0)]])
    last = StreamDelta(token_ids=[], logprobs=[], versions=[], finish_reason="stop", matched_stop=2)
    merged = merge_deltas([first, second, last])
    assert (merged.token_ids, merged.logprobs, merged.versions) == ([1, 2, 4], [-0.1, -0.2, -0.4], [3, 3, 4])
    assert merged.top_logprobs == [[], [], [(4, -0.4), (5, -1.0)]]  # a row a token, however they came
    assert (merged.finish_reason, merged.matched_stop) == ("stop", 2)
    assert merge_deltas([first]) is first and merge_deltas([first, first]).top_logprobs is None


# ---- SGLangEngine over real HTTP ----

IM_END = 2
CANNED = [(15, -0.5), (16, -0.25), (17, -999999999.0), (18, -0.125), (IM_END, -0.0625)]


def canned_sglang(calls: list, model_dir: str, *, broken: bool = False) -> FastAPI:
    """The subset of SGLang's native API the engine uses, with cumulative streamed chunks."""
    app = FastAPI()
    state = {"version": "default"}

    def chunk(n: int, finish: dict | None) -> str:
        ids = [i for i, _ in CANNED[:n]]
        meta = {
            "id": "rid",
            "finish_reason": finish,
            "prompt_tokens": 3,
            "completion_tokens": n,
            "weight_version": state["version"],
            "output_token_logprobs": [[lp, i, None] for i, lp in CANNED[:n]],
            "output_token_logprobs_length": n,
        }
        return "data: " + json.dumps({"text": None, "output_ids": ids, "meta_info": meta}) + "\n\n"

    @app.get("/model_info")
    def model_info():
        return {"model_path": model_dir, "tokenizer_path": model_dir, "weight_version": state["version"]}

    @app.get("/server_info")
    def server_info():
        return {"context_length": None, "max_total_num_tokens": 1024, "internal_states": [{}]}

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "tiny", "max_model_len": 2048}]}

    @app.get("/health")
    def health():
        return Response(status_code=500 if broken else 200)

    @app.post("/generate")
    async def generate_route(request: Request):
        body = await request.json()
        calls.append(("generate", body))
        if broken:
            return JSONResponse({"error": {"message": "scheduler crashed"}}, status_code=500)
        if not body["input_ids"]:
            return JSONResponse({"error": {"message": "input_ids is empty"}}, status_code=400)
        if not body["stream"]:
            return Response(chunk(5, {"type": "length"})[len("data: ") :], media_type="application/json")

        async def events():
            yield chunk(2, None)
            yield chunk(4, None)
            if body["input_ids"] == [666]:
                raise RuntimeError("connection lost mid-stream")
            yield chunk(5, {"type": "stop", "matched": IM_END})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/pause_generation")
    async def pause(request: Request):
        calls.append(("pause_generation", await request.json()))
        return {"message": "Generation paused successfully.", "status": "ok"}

    @app.post("/update_weights_from_disk")
    async def update(request: Request):
        body = await request.json()
        calls.append(("update_weights_from_disk", body))
        state["version"] = body["weight_version"]
        return {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}

    @app.post("/continue_generation")
    async def resume(request: Request):
        calls.append(("continue_generation", await request.json()))
        return {"message": "Generation continued successfully.", "status": "ok"}

    @app.post("/load_lora_adapter")
    async def load_lora(request: Request):
        calls.append(("load_lora_adapter", await request.json()))
        return {"success": True, "error_message": "", "loaded_adapters": {}}

    @app.post("/unload_lora_adapter")
    async def unload_lora(request: Request):
        calls.append(("unload_lora_adapter", await request.json()))
        return {"success": True, "error_message": "", "loaded_adapters": {}}

    return app


@pytest.fixture
def model_dir(tmp_path):
    config = {"model_type": "llama", "vocab_size": 32, "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 1, "intermediate_size": 8, "max_position_embeddings": 4096,
              "eos_token_id": IM_END}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [IM_END, 7]}))
    return str(tmp_path)


@pytest.mark.parametrize(("cap", "expected"), [(600, 600), (4096, 1024), (0, 1024)])
def test_engine_context_length_caps_what_the_server_reports(model_dir, cap, expected):
    """`engine.context_length` below the server's context (2048, its KV capacity 1024) is the
    context; above it, or 0, changes nothing."""
    with serve_app(canned_sglang([], model_dir)) as url:
        cfg = EngineConfig(backend="sglang", urls=[url], context_length=cap, timeout_s=10)

        async def scenario():
            engine = SGLangEngine(cfg)
            await engine.start()
            try:
                return engine.info.max_context
            finally:
                await engine.stop()

        assert asyncio.run(scenario()) == expected


def test_sglang_engine_end_to_end_drops_a_failing_server(model_dir):
    good_calls: list = []
    bad_calls: list = []
    with (
        serve_app(canned_sglang(bad_calls, model_dir, broken=True)) as bad,
        serve_app(canned_sglang(good_calls, model_dir)) as good,
    ):
        cfg = EngineConfig(backend="sglang", urls=[bad, good], retries=2, retry_dead_after_s=60.0, timeout_s=10)

        async def scenario():
            engine = SGLangEngine(cfg)
            await engine.start()
            assert engine.info.model_path == model_dir
            assert engine.info.max_context == 1024  # the server's 2048, capped by its KV capacity
            assert engine.info.eos_token_ids == (IM_END, 7)
            assert engine.version == 0

            params = SamplingParams(max_new_tokens=8, temperature=0.7, stop=("</tool_call>",))
            result = await generate(engine, [1, 2, 3], params, request_id="req-1", affinity="s1")
            assert result.output_ids == [i for i, _ in CANNED]
            assert result.logprobs == [lp for _, lp in CANNED]
            assert result.finish_reason == "stop" and result.matched_stop == IM_END
            assert result.versions == [0] * 5

            # The broken server was tried first (tie → first server), failed, and left rotation.
            assert len(bad_calls) == 1 and len(good_calls) == 1
            stats = {s["url"]: s for s in engine.pool.stats()}
            assert stats[bad]["alive"] is False and stats[bad]["failures"] == 1
            assert "scheduler crashed" in stats[bad]["last_error"]
            sent = good_calls[0][1]
            assert sent["input_ids"] == [1, 2, 3] and sent["rid"] == "req-1" and sent["stream"] is True
            assert sent["sampling_params"]["max_new_tokens"] == 8
            assert sent["sampling_params"]["stop"] == ["</tool_call>"]

            await generate(engine, [4], params, request_id="req-2", affinity="s2")
            assert len(bad_calls) == 1 and len(good_calls) == 2

            with pytest.raises(EngineRequestError, match="input_ids is empty"):
                await generate(engine, [], params, request_id="req-3")
            assert [s["alive"] for s in engine.pool.stats()] == [False, True]  # a 400 is not held against it

            health = await engine.health()
            assert health["backend"] == "sglang"
            assert [s["alive"] for s in health["servers"]] == [False, True]

            await engine.update_weights("/ckpt/step-1", 1)
            assert [c[0] for c in good_calls[-3:]] == [
                "pause_generation",
                "update_weights_from_disk",
                "continue_generation",
            ]
            assert good_calls[-3][1] == {"mode": "retract"}
            assert good_calls[-2][1]["model_path"] == "/ckpt/step-1"
            assert good_calls[-2][1]["weight_version"] == "1"
            assert engine.version == 1
            assert not any(c[0] == "pause_generation" for c in bad_calls)  # out of rotation: skipped

            after = await generate(engine, [5], params, request_id="req-4", affinity="s1")
            assert after.versions == [1] * 5

            # Nobody watches tokens arrive: one plain JSON answer, one delta.
            deltas = [d async for d in engine.stream([6], params, request_id="req-5", incremental=False)]
            assert good_calls[-1][1]["stream"] is False
            assert [(d.token_ids, d.versions, d.finish_reason) for d in deltas] == [
                ([i for i, _ in CANNED], [1] * 5, "length")
            ]

            # A server already serving this version (updated by another replica) is left alone.
            await engine.update_weights("/ckpt/step-1", 1)
            assert good_calls[-1][0] == "generate" and engine.version == 1
            await engine.stop()

        asyncio.run(scenario())


def test_sglang_engine_never_regenerates_after_tokens_were_streamed(model_dir):
    calls: list = []
    other_calls: list = []
    with serve_app(canned_sglang(calls, model_dir)) as url, serve_app(canned_sglang(other_calls, model_dir)) as other:
        cfg = EngineConfig(backend="sglang", urls=[url, other], retries=2, timeout_s=10)

        async def scenario():
            engine = SGLangEngine(cfg)
            await engine.start()
            got = []
            with pytest.raises(EngineUnavailable, match="mid-generation"):
                async for delta in engine.stream([666], SamplingParams(max_new_tokens=8), request_id="r"):
                    got.append(delta)
            assert [t for d in got for t in d.token_ids] == [15, 16, 17, 18]  # then the connection broke
            await engine.stop()

        asyncio.run(scenario())
    assert len(calls) + len(other_calls) == 1


def test_sglang_engine_with_every_server_down_is_unavailable():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, never listening: connection refused
    try:
        engine = SGLangEngine(EngineConfig(backend="sglang", urls=[url], timeout_s=5))
        with pytest.raises(EngineUnavailable, match="no SGLang server answered"):
            asyncio.run(engine.start())
    finally:
        sock.close()


# ---- VLLMEngine over real HTTP ----


def canned_vllm(calls: list, model_dir: str) -> FastAPI:
    """vLLM's OpenAI server subset (dev mode on): delta chunks with token ids, spans at the end."""
    app = FastAPI()
    state = {"version": "default"}

    def chunk(part: list[tuple[int, float]], **extra) -> str:
        choice = {
            "index": 0,
            "text": "x",
            "logprobs": {
                "tokens": [f"token_id:{i}" for i, _ in part],
                "token_logprobs": [lp for _, lp in part],
                "top_logprobs": [{f"token_id:{i}": lp} for i, lp in part],
            },
            "token_ids": [i for i, _ in part],
            "finish_reason": None,
            "stop_reason": None,
            **extra,
        }
        return "data: " + json.dumps({"id": "cmpl-1", "model": "tiny", "choices": [choice]}) + "\n\n"

    @app.get("/v1/models")
    def models():
        return {"data": [{"id": "tiny", "root": model_dir, "max_model_len": 512}]}

    @app.get("/weight_info")
    def weight_info():
        return {"weight_version": state["version"]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        calls.append(("completions", dict(request.query_params), body))

        async def events():
            yield chunk(CANNED[:3], prompt_token_ids=body["prompt"])
            spans = [{"version": state["version"], "start": 0, "end": len(CANNED)}]
            yield chunk(CANNED[3:], finish_reason="stop", weight_versions=spans)
            yield "data: " + json.dumps({"id": "cmpl-1", "choices": [], "usage": {}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    async def record(request: Request, name: str) -> dict:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        calls.append((name, dict(request.query_params), body))
        return body or {}

    @app.post("/pause")
    async def pause(request: Request):
        await record(request, "pause")
        return {"status": "paused"}

    @app.post("/collective_rpc")
    async def rpc(request: Request):
        await record(request, "collective_rpc")
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset(request: Request):
        await record(request, "reset_prefix_cache")
        return {"success": True}

    @app.post("/update_weight_version")
    async def set_version(request: Request):
        state["version"] = (await record(request, "update_weight_version"))["new_version"]
        return {"success": True, "new_version": state["version"]}

    @app.post("/resume")
    async def resume(request: Request):
        await record(request, "resume")
        return {"status": "resumed"}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(request: Request):
        body = await record(request, "load_lora_adapter")
        return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(request: Request):
        body = await record(request, "unload_lora_adapter")
        return PlainTextResponse(f"Success: LoRA adapter '{body['lora_name']}' removed successfully.")

    return app


def test_vllm_engine_end_to_end(model_dir):
    calls: list = []
    with serve_app(canned_vllm(calls, model_dir)) as url:

        async def scenario():
            engine = VLLMEngine(EngineConfig(backend="vllm", urls=[url], timeout_s=10))
            await engine.start()
            assert engine.info.model_path == model_dir and engine.info.max_context == 512
            assert engine.info.eos_token_ids == (IM_END, 7)

            params = SamplingParams(max_new_tokens=8, top_logprobs=1)
            result = await generate(engine, [1, 2, 3], params, request_id="req-1", affinity="s")
            assert result.output_ids == [i for i, _ in CANNED]
            assert result.logprobs == [lp for _, lp in CANNED]
            assert result.top_logprobs == [[(i, lp)] for i, lp in CANNED]
            assert (result.finish_reason, result.matched_stop) == ("stop", IM_END)
            sent = calls[0][2]
            assert sent["prompt"] == [1, 2, 3] and sent["model"] == "tiny" and sent["logprobs"] == 1

            await engine.update_weights("/ckpt/step-2", 2)
            names = [c[0] for c in calls[1:]]
            assert names == [
                "pause",
                "collective_rpc",
                "reset_prefix_cache",
                "update_weight_version",
                "resume",
            ]
            assert calls[1][1] == {"mode": "keep"}
            assert calls[2][2] == {
                "method": "reload_weights",
                "kwargs": {"weights_path": "/ckpt/step-2", "is_checkpoint_format": True},
            }
            assert calls[3][1] == {"reset_running_requests": "true"}
            assert calls[4][2] == {"new_version": "2"}
            assert engine.version == 2

            after = await generate(engine, [4], params, request_id="req-2")
            assert after.versions == [2] * len(CANNED)
            streamed = [d async for d in engine.stream([5], params, request_id="req-3", incremental=False)]
            assert calls[-1][2]["stream"] is True  # vLLM is streamed regardless
            assert [t for d in streamed for t in d.token_ids] == after.output_ids and streamed[-1].finish_reason
            await engine.stop()

        asyncio.run(scenario())
