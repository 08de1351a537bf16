"""What the proxy adds to every call: latency (sequential) and throughput (32 concurrent).

The same chat requests are sent (a) straight to an instant engine
(benchmarks/instant_engine.py, answering /v1/chat/completions itself) and (b)
through `areal-proxy serve --set engine.backend=sglang` in front of that engine's
SGLang-protocol `/generate`, with recording on (SQLite, commit before answer). The
proxy is pinned to one core, the engine and this load generator to the other.

    python benchmarks/proxy_overhead.py [--requests 1000] [--concurrency 32] [--db URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx

from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy

REPO = Path(__file__).resolve().parents[1]


def body(i: int) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": f"Request {i}: say hello."}], "max_tokens": 16}


async def post(session: aiohttp.ClientSession, url: str, i: int) -> float:
    t = time.perf_counter()
    async with session.post(url, json=body(i)) as r:
        text = await r.read()
        assert r.status == 200, text
    return time.perf_counter() - t


# The load generator uses aiohttp: httpx costs ~2 ms of client CPU per request, which would
# make the client, not the servers, the limit.
async def sequential(url: str, n: int) -> list[float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for i in range(20):  # warm-up
            await post(session, url, i)
        return [await post(session, url, i) for i in range(n)]


async def concurrent(url: str, n: int, concurrency: int) -> tuple[float, list[float]]:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), connector=connector) as session:
        await asyncio.gather(*(post(session, url, i) for i in range(concurrency)))  # warm-up
        times: list[float] = []
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                times.append(await post(session, url, queue.pop()))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return n / (time.perf_counter() - start), times


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


def pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if os.path.exists("/usr/bin/taskset") and os.cpu_count() > 1 else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--db", default="", help="store URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {1}) if hasattr(os, "sched_setaffinity") and os.cpu_count() > 1 else None
    tmp = Path(tempfile.mkdtemp(prefix="areal-overhead-"))
    engine_port, proxy_port = free_port(), free_port()
    engine_url, proxy_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
    env = {"HF_HUB_OFFLINE": "1"}
    db = args.db or f"sqlite:///{tmp}/areal.db"
    engine_argv = [*pin(1), sys.executable, str(REPO / "benchmarks/instant_engine.py"), "--port", str(engine_port)]
    proxy_argv = [*pin(0), sys.executable, "-m", "proxy.cli", "serve", "--port", str(proxy_port), "--db", db]
    proxy_argv += ["--set", "engine.backend=sglang", "--set", f'engine.urls=["{engine_url}"]']
    proxy_argv += ["--set", "proxy.log_level=warning"]
    engine = start_process(engine_argv, tmp / "engine.log", env=env)
    proxy = None
    try:
        wait_healthy(engine_url, engine, timeout=300, log_path=tmp / "engine.log")
        proxy = start_process(proxy_argv, tmp / "proxy.log", cwd=tmp, env=env)
        wait_healthy(proxy_url, proxy, timeout=300, log_path=tmp / "proxy.log")
        direct = f"{engine_url}/v1/chat/completions"
        through = f"{proxy_url}/v1/chat/completions"
        seq_direct = asyncio.run(sequential(direct, args.requests))
        seq_proxy = asyncio.run(sequential(through, args.requests))
        rps_direct, con_direct = asyncio.run(concurrent(direct, args.requests * 2, args.concurrency))
        rps_proxy, con_proxy = asyncio.run(concurrent(through, args.requests * 2, args.concurrency))
        recorded = httpx.get(f"{proxy_url}/sessions?limit=1", timeout=30).json()["total"]
    finally:
        stop_process(proxy, 30)
        stop_process(engine, 30)
    result = {
        "sequential_direct_p50_ms": round(pct(seq_direct, 0.5), 3),
        "sequential_proxy_p50_ms": round(pct(seq_proxy, 0.5), 3),
        "added_p50_ms": round(pct(seq_proxy, 0.5) - pct(seq_direct, 0.5), 3),
        "added_p99_ms": round(pct(seq_proxy, 0.99) - pct(seq_direct, 0.99), 3),
        "added_mean_ms": round((statistics.mean(seq_proxy) - statistics.mean(seq_direct)) * 1e3, 3),
        f"concurrent{args.concurrency}_direct_rps": round(rps_direct, 1),
        f"concurrent{args.concurrency}_proxy_rps": round(rps_proxy, 1),
        f"concurrent{args.concurrency}_proxy_p50_ms": round(pct(con_proxy, 0.5), 2),
        f"concurrent{args.concurrency}_proxy_p99_ms": round(pct(con_proxy, 0.99), 2),
        f"concurrent{args.concurrency}_direct_p50_ms": round(pct(con_direct, 0.5), 2),
        "sessions_recorded": recorded,
        "store": db.split(":")[0],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
