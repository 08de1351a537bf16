"""What a proxy adds to every call, ours and its peers', measured side by side in one run.

The same chat requests are sent straight to an instant engine (benchmarks/instant_engine.py, which
answers `/v1/chat/completions` itself, and SGLang's `/generate` for our proxy) and through each proxy
in front of it, one proxy at a time:

- `areal-proxy serve --set engine.backend=sglang`, recording every call token-exact with commit before
  answer, on SQLite (WAL, `synchronous=FULL`) and, with `--postgres`, on a fresh PostgreSQL database;
- with `--front`, the SQLite one again behind `areal-proxy front` (pinned to core 1): what the front adds;
- each peer proxy installed in its own venv (benchmarks/peers.py says how to make them), with its
  documented settings, in front of the engine's `/v1/chat/completions`.

Each proxy is pinned to core 0, the engine and this load generator to core 1. Per proxy: latency added
over the direct call at p50/p99 (sequential), requests/s and p50/p99 at `--concurrency` in flight, and
the proxy's CPU time per request (its whole process tree, over the concurrent phase). Then ours against
the best peer. Only ratios within one run mean anything on a shared machine.

    python benchmarks/proxy_overhead.py [--requests 1000] [--concurrency 32] [--postgres] [--front] [--agent] [--json F]

`--agent` sends what a tool-using agent sends on every call (a system prompt and six tools, ~1,000
prompt tokens once rendered) instead of a one-line question.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.peers import Peer, installed_peers  # noqa: E402
from tests.conftest import PG_ADMIN_URL, fresh_pg_database  # noqa: E402
from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy  # noqa: E402


@dataclass(frozen=True)
class Ask:
    """What each request is: `agent`, as a tool-using agent asks (a system prompt and six tools, ~1,000
    prompt tokens with SmolLM2's tool section, the same on every call), else a one-line question;
    `stream`, its answer streamed (SSE) and read to its end."""

    agent: bool = False
    stream: bool = False
    api: str = "chat"  # or "responses", "messages": the same request in that API's shape, at its route


API_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# How each API's streamed answer ends.
STREAM_ENDS = {"chat": b"data: [DONE]\n\n", "responses": b"response.completed", "messages": b"message_stop"}
SYSTEM = "You are a careful travel agent. Check before you answer. " * 12


def body(i: int, model: str, ask: Ask = Ask()) -> dict:
    question = {"role": "user", "content": f"Request {i}: say hello."}
    if ask.api == "responses":
        request: dict = {"model": model, "input": question["content"], "max_output_tokens": 16}
        if ask.agent:
            request.update(instructions=SYSTEM, tools=[{"type": "function", **t["function"]} for t in AGENT_TOOLS])
    elif ask.api == "messages":
        request = {"model": model, "messages": [question], "max_tokens": 16}
        if ask.agent:
            tools = [
                {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
                for f in (t["function"] for t in AGENT_TOOLS)
            ]
            request.update(system=SYSTEM, tools=tools)
    else:
        request = {"model": model, "messages": [question], "max_tokens": 16}
        if ask.agent:
            request.update(messages=[{"role": "system", "content": SYSTEM}, question], tools=AGENT_TOOLS)
    if ask.stream:
        request["stream"] = True
    return request


AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"lookup_{topic}",
            "description": f"Look up the {topic} for a city on a date, in the units the user asked for.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "the city"},
                    "date": {"type": "string", "description": "the date, YYYY-MM-DD"},
                    "units": {"type": "string", "enum": ["metric", "imperial"]},
                },
                "required": ["city"],
            },
        },
    }
    for topic in ("weather", "flights", "hotels", "trains", "museums", "restaurants")
]


class Failed(Exception):
    pass


async def post(session: aiohttp.ClientSession, url: str, model: str, i: int, ask: Ask = Ask()) -> float:
    """One request, its answer read whole; `url` is the chat route's, `ask.api` picks the route."""
    if ask.api != "chat":
        url = url.replace(API_PATHS["chat"], API_PATHS[ask.api])
    t = time.perf_counter()
    async with session.post(url, json=body(i, model, ask)) as r:
        text = await r.read()
        if r.status != 200:
            raise Failed(f"{r.status}: {text[:300]!r}")
        if ask.stream and STREAM_ENDS[ask.api] not in text[-300:]:
            raise Failed(f"a streamed answer without its end: {text[-300:]!r}")
    return time.perf_counter() - t


# The load generator uses aiohttp: httpx costs ~2 ms of client CPU per request, which would make the
# client, not the servers, the limit.
async def sequential(url: str, model: str, n: int, ask: Ask = Ask()) -> list[float]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        for i in range(20):  # warm-up
            await post(session, url, model, i, ask)
        return [await post(session, url, model, i, ask) for i in range(n)]


async def concurrent(
    url: str, model: str, n: int, concurrency: int, cpu: Callable[[], float], ask: Ask = Ask()
) -> dict:
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120), connector=connector) as session:
        await asyncio.gather(*(post(session, url, model, i, ask) for i in range(concurrency)))  # warm-up
        times: list[float] = []
        errors: list[str] = []
        queue = list(range(n))

        async def worker() -> None:
            while queue:
                try:
                    times.append(await post(session, url, model, queue.pop(), ask))
                except Failed as exc:  # counted and shown: one peer's client sometimes loses a race
                    errors.append(str(exc))

        cpu_before, start = cpu(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall, cpu_s = time.perf_counter() - start, cpu() - cpu_before
    return {"rps": len(times) / wall, "times": times, "cpu_ms_per_request": cpu_s / n * 1e3, "errors": errors}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


def pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if os.path.exists("/usr/bin/taskset") and os.cpu_count() > 1 else []


def tree_cpu(pid: int) -> Callable[[], float]:
    """Seconds of CPU used so far by `pid` and its descendants (a peer may serve from worker processes)."""

    def total() -> float:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            seconds = 0.0
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = proc.cpu_times()
                    seconds += t.user + t.system
            return seconds
        return 0.0

    return total


def wait_answering(url: str, model: str, proc, log: Path, timeout: float = 300) -> int:  # noqa: ANN001
    """Until a chat request through `url` answers 200 (peers have no common health route): 1, the calls
    answered (and so recorded)."""
    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.post(url, json=body(0, model), timeout=30)
            if r.status_code == 200:
                return 1
            last = f"{r.status_code} {r.text[:300]}"
        time.sleep(1)
    raise RuntimeError(f"no answer from {url} in {timeout:.0f}s (last: {last}):\n{log.read_text()[-3000:]}")


@dataclass
class Target:
    name: str
    version: str
    argv: list[str]
    url: str  # the chat completions URL
    model: str
    env: dict[str, str]
    cwd: Path
    recorded: Callable[[], int]  # calls recorded so far
    front: bool = False  # reached through `areal-proxy front` (pinned to core 1) in front of it


def ours(engine_url: str, db: str, label: str, tmp: Path) -> Target:
    from importlib.metadata import version

    port = free_port()
    argv = [sys.executable, "-m", "proxy.cli", "serve", "--port", str(port), "--db", db]
    argv += ["--set", "engine.backend=sglang", "--set", f'engine.urls=["{engine_url}"]']
    argv += ["--set", "proxy.log_level=warning"]
    return Target(
        name=f"areal-proxy ({label})",
        version=version("areal-proxy"),
        argv=argv,
        url=f"http://127.0.0.1:{port}/v1/chat/completions",
        model="m",
        env={"HF_HUB_OFFLINE": "1"},
        cwd=tmp,
        recorded=lambda: httpx.get(f"http://127.0.0.1:{port}/sessions?limit=1", timeout=30).json()["total"],
    )


def peer_target(peer: Peer, engine_url: str, tmp: Path) -> Target:
    port = free_port()
    workdir = tmp / peer.name
    workdir.mkdir(parents=True, exist_ok=True)
    return Target(
        name=peer.name,
        version=peer.version,
        argv=peer.argv(engine_url, port, workdir),
        url=f"http://127.0.0.1:{port}{peer.path}",
        model=peer.model,
        env=peer.env(workdir),
        cwd=workdir,
        recorded=lambda: peer.recorded(f"http://127.0.0.1:{port}", workdir),
    )


def measure(target: Target, direct_seq: list[float], args: argparse.Namespace, tmp: Path) -> dict:
    log = tmp / f"{target.name.replace(' ', '_').replace('(', '').replace(')', '')}.log"
    proc = start_process([*pin(0), *target.argv], log, cwd=target.cwd, env=target.env)
    front = None
    url, cpu = target.url, tree_cpu(proc.pid)
    try:
        answered = wait_answering(target.url, target.model, proc, log)
        if target.front:
            replica = target.url.removesuffix("/v1/chat/completions")
            port = free_port()
            argv = [*pin(1), sys.executable, "-m", "proxy.cli", "front", "--port", str(port), "--replicas", replica]
            front = start_process([*argv, "--set", "proxy.log_level=warning"], tmp / "front.log", cwd=tmp)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            answered += wait_answering(url, target.model, front, tmp / "front.log")
            replica_cpu, front_cpu = cpu, tree_cpu(front.pid)
            cpu = lambda: replica_cpu() + front_cpu()  # noqa: E731
        seq = asyncio.run(sequential(url, target.model, args.requests, Ask(args.agent)))
        con = asyncio.run(concurrent(url, target.model, args.requests * 2, args.concurrency, cpu, Ask(args.agent)))
        time.sleep(2)  # a peer that records after answering has had time to write the last ones
        recorded = target.recorded()
    finally:
        stop_process(front, 30)
        stop_process(proc, 30)
    p50_32, p99_32 = pct(con["times"], 0.5), pct(con["times"], 0.99)
    return {
        "name": target.name,
        "version": target.version,
        "added_p50_ms": round(pct(seq, 0.5) - pct(direct_seq, 0.5), 3),
        "added_p99_ms": round(pct(seq, 0.99) - pct(direct_seq, 0.99), 3),
        "rps": round(con["rps"], 1),
        "p50_ms": round(p50_32, 2),
        "p99_ms": round(p99_32, 2),
        "p99_over_p50": round(p99_32 / p50_32, 2),
        "cpu_ms_per_request": round(con["cpu_ms_per_request"], 3),
        "errors": len(con["errors"]),
        "first_error": con["errors"][0] if con["errors"] else "",
        "sent": answered + 20 + args.requests + args.concurrency + args.requests * 2,
        "recorded": recorded,
    }


def table(rows: list[dict], concurrency: int) -> str:
    head = (
        f"| proxy | version | added p50 | added p99 | req/s at {concurrency} | p50 / p99 at {concurrency} "
        "| p99/p50 | CPU per request | recorded / sent |"
    )
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        failed = f" ({r['errors']} failed)" if r.get("errors") else ""
        lines.append(
            f"| {r['name']} | {r['version']} | {r['added_p50_ms']:.2f} ms | {r['added_p99_ms']:.2f} ms "
            f"| {r['rps']:,.0f} "
            f"| {r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms | {r['p99_over_p50']:.1f} | {r['cpu_ms_per_request']:.2f} ms "
            f"| {r.get('recorded', '')} / {r.get('sent', '')}{failed} |"
        )
    return "\n".join(lines)


def ratios(rows: list[dict]) -> list[str]:
    """Ours against the best peer on each measure (the issue's targets in brackets)."""
    mine = [r for r in rows if r["name"].startswith("areal-proxy")]
    peers = [r for r in rows if not r["name"].startswith("areal-proxy") and r["name"] != "direct"]
    if not mine or not peers:
        return ["(no peer installed: see benchmarks/peers.py)"] if mine else []
    best_p50 = min(peers, key=lambda r: r["added_p50_ms"])
    best_rps = max(peers, key=lambda r: r["rps"])
    best_cpu = min(peers, key=lambda r: r["cpu_ms_per_request"])
    out = []
    for r in mine:
        out.append(
            f"{r['name']}: added p50 {r['added_p50_ms'] / best_p50['added_p50_ms']:.2f}x {best_p50['name']}'s "
            f"(target <= 0.2); req/s {r['rps'] / best_rps['rps']:.2f}x {best_rps['name']}'s (target >= 5); "
            f"CPU per request {r['cpu_ms_per_request'] / best_cpu['cpu_ms_per_request']:.2f}x {best_cpu['name']}'s; "
            f"p99/p50 at 32 {r['p99_over_p50']:.1f} (target <= 3)"
        )
    sqlite = next((r for r in mine if r["name"] == "areal-proxy (SQLite)"), None)
    front = next((r for r in mine if "front" in r["name"]), None)
    if sqlite and front:
        out.append(
            f"the front adds {front['added_p50_ms'] - sqlite['added_p50_ms']:.2f} ms at p50 (target <= 0.3) and "
            f"costs {1 - front['rps'] / sqlite['rps']:.0%} of the replica's req/s (target <= 10%)"
        )
    pg = next((r for r in mine if "PostgreSQL" in r["name"]), None)
    if sqlite and pg:
        out.append(
            f"PostgreSQL against SQLite: added p50 {pg['added_p50_ms'] / sqlite['added_p50_ms']:.2f}x, "
            f"req/s {sqlite['rps'] / pg['rps']:.2f}x fewer (target: within 1.5x)"
        )
    return out


@contextlib.contextmanager
def instant_engine(tmp: Path) -> Iterator[str]:
    """This load generator on core 1 and the instant engine beside it: its URL while it runs."""
    if hasattr(os, "sched_setaffinity") and os.cpu_count() > 1:
        os.sched_setaffinity(0, {1})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [*pin(1), sys.executable, str(REPO / "benchmarks/instant_engine.py"), "--port", str(port)]
    engine = start_process(argv, tmp / "engine.log", env={"HF_HUB_OFFLINE": "1"})
    try:
        wait_healthy(url, engine, timeout=300, log_path=tmp / "engine.log")
        yield url
    finally:
        stop_process(engine, 30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="sequential requests; twice as many concurrent")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--postgres", action="store_true", help=f"also ours on a fresh database at {PG_ADMIN_URL}")
    parser.add_argument("--no-peers", action="store_true", help="leave out the peers even where installed")
    parser.add_argument("--front", action="store_true", help="also ours on SQLite through `areal-proxy front`")
    parser.add_argument("--agent", action="store_true", help="an agent's request: system prompt and six tools")
    parser.add_argument("--json", default="", help="write the rows here as well")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="areal-overhead-"))
    rows: list[dict] = []
    with instant_engine(tmp) as engine_url:
        direct = f"{engine_url}/v1/chat/completions"
        ask = Ask(args.agent)
        direct_seq = asyncio.run(sequential(direct, "m", args.requests, ask))
        direct_con = asyncio.run(concurrent(direct, "m", args.requests * 2, args.concurrency, lambda: 0.0, ask))
        rows.append(
            {
                "name": "direct",
                "version": "",
                "added_p50_ms": 0.0,
                "added_p99_ms": 0.0,
                "rps": round(direct_con["rps"], 1),
                "p50_ms": round(pct(direct_con["times"], 0.5), 2),
                "p99_ms": round(pct(direct_con["times"], 0.99), 2),
                "p99_over_p50": round(pct(direct_con["times"], 0.99) / pct(direct_con["times"], 0.5), 2),
                "cpu_ms_per_request": 0.0,
                "direct_p50_ms": round(pct(direct_seq, 0.5), 3),
            }
        )
        targets = [ours(engine_url, f"sqlite:///{tmp}/areal.db", "SQLite", tmp)]
        if args.front:
            through = ours(engine_url, f"sqlite:///{tmp}/front.db", "SQLite, through the front", tmp)
            through.front = True
            targets.append(through)
        with contextlib.ExitStack() as stack:
            if args.postgres:
                targets.append(ours(engine_url, stack.enter_context(fresh_pg_database()), "PostgreSQL", tmp))
            if not args.no_peers:
                targets += [peer_target(p, engine_url, tmp) for p in installed_peers()]
            for target in targets:
                print(f"measuring {target.name} {target.version} ...", file=sys.stderr)
                rows.append(measure(target, direct_seq, args, tmp))
    print(table(rows, args.concurrency))
    for line in ratios(rows):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
