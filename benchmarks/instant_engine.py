"""An "instant" engine for measuring the proxy's own overhead — the only fake engine allowed.

It speaks the SGLang native subset the proxy's `sglang` backend uses (`/generate`,
streaming or not, `/model_info`, `/server_info`, `/health`) and, for the baseline,
`/v1/chat/completions` itself; every answer is the same short reply, returned at
once, so what a benchmark measures is the HTTP and bookkeeping around the model.

    python benchmarks/instant_engine.py --port 31000
"""

from __future__ import annotations

import argparse
import gc
import time

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

REPLY = "Hello! How can I help you today?"


def build(model_path: str, eos_id: int, reply_ids: list[int]) -> Starlette:
    output = reply_ids + [eos_id]
    logprobs = [[-0.1, t, None] for t in output]

    def meta(n: int, done: bool) -> dict:
        return {
            "id": "x",
            "finish_reason": {"type": "stop", "matched": eos_id} if done else None,
            "prompt_tokens": 10,
            "completion_tokens": n,
            "cached_tokens": 0,
            "weight_version": "0",
            "output_token_logprobs": logprobs[:n],
        }

    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if body.get("stream"):

            async def chunks():  # one event a token, each with everything so far, as SGLang streams by default
                for n in range(1, len(output) + 1):
                    chunk = {"text": REPLY[: len(REPLY) * n // len(output)], "output_ids": output[:n]}
                    yield b"data: " + orjson.dumps({**chunk, "meta_info": meta(n, n == len(output))}) + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return Response(
            orjson.dumps({"text": REPLY, "output_ids": output, "meta_info": meta(len(output), True)}),
            media_type="application/json",
        )

    def chat_logprobs(top: int) -> dict:
        entry = lambda t: {"token": f"<{t}>", "logprob": -0.1, "bytes": None}  # noqa: E731
        return {"content": [{**entry(t), "top_logprobs": [entry(t)] * top} for t in output]}

    async def chat(request: Request) -> Response:
        # As vLLM answers: logprobs when asked, and the token ids with `return_token_ids` (what a
        # recording peer asks for), so that every proxy in front gets and handles the same data.
        body = orjson.loads(await request.body())
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": REPLY},
            "finish_reason": "stop",
            "logprobs": chat_logprobs(body.get("top_logprobs") or 0) if body.get("logprobs") else None,
        }
        payload = {
            "id": "chatcmpl-instant",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "instant",
            "choices": [choice],
            "usage": {"prompt_tokens": 10, "completion_tokens": len(output), "total_tokens": 10 + len(output)},
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = output
            payload["prompt_token_ids"] = list(range(10))
        return Response(orjson.dumps(payload), media_type="application/json")

    async def model_info(_: Request) -> Response:
        info = {"model_path": model_path, "tokenizer_path": model_path, "is_generation": True, "weight_version": "0"}
        return Response(orjson.dumps(info), media_type="application/json")

    async def server_info(_: Request) -> Response:
        return Response(
            orjson.dumps({"context_length": 8192, "max_total_num_tokens": 1_000_000}), media_type="application/json"
        )

    async def health(_: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/model_info", model_info),
            Route("/get_model_info", model_info),
            Route("/server_info", server_info),
            Route("/get_server_info", server_info),
            Route("/health", health),
        ]
    )


def main() -> None:
    import uvicorn
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=31000)
    args = parser.parse_args()
    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    tok = AutoTokenizer.from_pretrained(path)
    app = build(path, tok.eos_token_id, tok.encode(REPLY, add_special_tokens=False))
    # What the imports and the tokenizer left (transformers: hundreds of thousands of objects) goes to the
    # collector's permanent generation, as `areal-proxy serve` does once started: otherwise a full pass
    # here, 170-240 ms mid-run, stalls every request in flight through whichever proxy is being measured.
    del tok
    gc.collect()
    gc.freeze()
    # A long keep-alive: a client reusing a connection just as the server closes it gets an error that
    # is neither proxy's doing (LiteLLM's client did, at uvicorn's default 5 s).
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, timeout_keep_alive=300)


if __name__ == "__main__":
    main()
