"""How long the proxy's event loop stalls under an 8 MiB prompt and a 4,000-token stream.

Starts `areal-proxy serve` (the real model, SQLite), then probes it with `GET /v1/models` (no
engine, no store: only the event loop) every 5 ms from a second connection while one heavy
request runs: a chat completion whose prompt is 8 MiB of text less 4 KiB, so that the body fits
`[proxy] max_request_bytes` (refused with 422 once it is tokenized: over the context), and a
streamed completion of 4,000 tokens (`ignore_eos`). The longest probe latency, less the median
probe latency when idle, is the longest stall a client of the proxy saw. Run it on a quiet
machine; only the figures of one run compare.

    python benchmarks/event_loop_stall.py            # both scenarios
    python benchmarks/event_loop_stall.py --tokens 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy  # noqa: E402


async def probe(url: str, stop: asyncio.Event, every_s: float = 0.005) -> list[float]:
    """Latencies of `GET /v1/models`, one at a time, until `stop`."""
    latencies = []
    async with httpx.AsyncClient(timeout=60) as client:
        while not stop.is_set():
            t = time.perf_counter()
            await client.get(url + "/v1/models")
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(every_s)
    return latencies


async def during(url: str, heavy) -> tuple[list[float], object]:  # noqa: ANN001
    stop = asyncio.Event()
    prober = asyncio.create_task(probe(url, stop))
    await asyncio.sleep(0.5)
    try:
        outcome = await heavy()
    finally:
        stop.set()
    return await prober, outcome


async def huge_prompt(url: str, mib: int) -> str:
    size = (mib << 20) - 4096  # the whole body just under [proxy] max_request_bytes (8 MiB by default)
    text = ("All work and no play makes Jack a dull boy. " * (size // 44 + 1))[:size]
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    async with httpx.AsyncClient(timeout=600) as client:
        r = await client.post(url + "/v1/chat/completions", json=body)
    return f"HTTP {r.status_code}: {r.json()['error']['message'][:100] if r.status_code != 200 else 'ok'}"


async def long_stream(url: str, tokens: int) -> str:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    chunks = 0
    async with (
        httpx.AsyncClient(timeout=3600) as client,
        client.stream("POST", url + "/v1/chat/completions", json=body) as r,
    ):
        async for line in r.aiter_lines():
            chunks += line.startswith("data: ")
    return f"HTTP {r.status_code}, {chunks} SSE events"


def summary(name: str, idle: list[float], busy: list[float], outcome: object) -> dict:
    base = statistics.median(idle)
    return {
        "scenario": name,
        "outcome": outcome,
        "probes": len(busy),
        "idle_median_ms": round(base * 1e3, 2),
        "busy_median_ms": round(statistics.median(busy) * 1e3, 2),
        "busy_p99_ms": round(sorted(busy)[int(len(busy) * 0.99) - 1] * 1e3, 2),
        "longest_stall_ms": round((max(busy) - base) * 1e3, 1),
    }


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="areal-stall-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--db", f"sqlite:///{tmp}/areal.db"]
    proc = start_process(argv, tmp / "serve.log", cwd=tmp)
    try:
        wait_healthy(url, proc, timeout=300, log_path=tmp / "serve.log")
        idle, _ = await during(url, lambda: asyncio.sleep(2))
        results = []
        if args.mib:
            busy, outcome = await during(url, lambda: huge_prompt(url, args.mib))
            results.append(summary(f"{args.mib} MiB prompt", idle, busy, outcome))
            print(json.dumps(results[-1]), flush=True)
        if args.tokens:
            busy, outcome = await during(url, lambda: long_stream(url, args.tokens))
            results.append(summary(f"{args.tokens}-token stream", idle, busy, outcome))
            print(json.dumps(results[-1]), flush=True)
        print(json.dumps(results, indent=2))
    finally:
        stop_process(proc, 30)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=8, help="size of the huge prompt in MiB (0: skip)")
    parser.add_argument("--tokens", type=int, default=4000, help="tokens of the long stream (0: skip)")
    asyncio.run(main(parser.parse_args()))
