"""Our proxy from two (or more) source trees, side by side in one run: before and after a change.

On a shared machine one proxy's requests/s moves by a third from run to run, more than most changes
move it; alternating the versions in rounds, in front of the same instant engine, and comparing
medians separates the change from the machine. Each round starts each version fresh (`areal-proxy
serve` on SQLite, pinned to core 0, its source tree first on PYTHONPATH) and measures sequential
latency and requests/s and CPU per request at 32 in flight, as `proxy_overhead.py` does (with
`--postgres`, also the CPU the machine's PostgreSQL server used a request meanwhile; on SQLite, the
largest the write-ahead log file grew); `--agent`
sends an agent's request (a system prompt and six tools, ~1,000 prompt tokens) instead of one line;
`--stream` asks for streamed answers (the engine sends an event a token, as SGLang does); `--api
responses` or `--api messages` sends the same request to the Responses or Anthropic Messages route; `--front`
measures each version's `areal-proxy front` (pinned to core 1) over its replica instead: the front's
CPU per request, requests/s through it, and what it adds to the replica's sequential p50.

    git worktree add /tmp/before HEAD~1
    python benchmarks/proxy_ab.py before=/tmp/before after=. [--rounds 4] [--requests 3000] [--postgres] \
        [--agent] [--stream] [--api chat|responses|messages] [--front]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.proxy_overhead import (  # noqa: E402
    Ask,
    concurrent,
    instant_engine,
    ours,
    pct,
    pin,
    sequential,
    tree_cpu,
    wait_answering,
)
from tests.conftest import fresh_pg_database  # noqa: E402
from trainer.launch.processes import free_port, start_process, stop_process  # noqa: E402


def one_round(name: str, source: Path, engine_url: str, db_url: str, args: argparse.Namespace, tmp: Path) -> dict:
    target = ours(engine_url, db_url, name, tmp)
    ask = Ask(agent=args.agent, stream=args.stream, api=args.api)
    env = {**target.env, "PYTHONPATH": str(source)}
    log = tmp / f"{name}.log"
    proc = start_process([*pin(0), *target.argv], log, cwd=target.cwd, env=env)
    front = None
    try:
        wait_answering(target.url, target.model, proc, log)
        url, cpu, direct = target.url, tree_cpu(proc.pid), None
        if args.front:  # the same version's front (pinned to core 1) over this replica; its CPU is measured
            replica = target.url.removesuffix("/v1/chat/completions")
            port = free_port()
            argv = [*pin(1), sys.executable, "-m", "proxy.cli", "front", "--port", str(port), "--replicas", replica]
            front_log = tmp / f"{name}-front.log"
            front = start_process([*argv, "--set", "proxy.log_level=warning"], front_log, cwd=tmp, env=env)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            wait_answering(url, target.model, front, front_log)
            cpu = tree_cpu(front.pid)
            direct = asyncio.run(sequential(target.url, target.model, args.sequential, ask))
        seq = asyncio.run(sequential(url, target.model, args.sequential, ask))
        server_before = database_server_cpu()
        with wal_sampler(db_url) as wal:
            con = asyncio.run(concurrent(url, target.model, args.requests, 32, cpu, ask))
        server_s = database_server_cpu() - server_before
    finally:
        if front is not None:
            stop_process(front, 30)
        stop_process(proc, 30)
    return {
        "rps": con["rps"],
        "cpu_ms": con["cpu_ms_per_request"],
        # with --front: what the front adds to the replica's sequential p50, measured in the same round
        "seq_p50_ms": pct(seq, 0.5) - (pct(direct, 0.5) if direct else 0.0),
        "p99_over_p50": pct(con["times"], 0.99) / pct(con["times"], 0.5),
        "db_cpu_ms": server_s / args.requests * 1e3 if args.postgres else None,
        "wal_mb": max(wal, default=0.0) / 2**20,  # SQLite: the largest its write-ahead log file grew
    }


@contextlib.contextmanager
def wal_sampler(db_url: str, every_s: float = 0.1) -> Iterator[list[int]]:
    """The sizes of a SQLite database's write-ahead log file, sampled from a thread while the block runs
    (nothing for PostgreSQL): the log SQLite could not start over grows with every commit."""
    sizes: list[int] = []
    path = Path(db_url.removeprefix("sqlite:///") + "-wal") if db_url.startswith("sqlite:///") else None
    done = threading.Event()

    def sample() -> None:
        while path is not None and not done.wait(every_s):
            with contextlib.suppress(OSError):
                sizes.append(path.stat().st_size)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield sizes
    finally:
        done.set()
        thread.join()


def database_server_cpu() -> float:
    """Seconds of CPU used so far by this machine's PostgreSQL server processes (0 if none are visible)."""
    seconds = 0.0
    for proc in psutil.process_iter(["name"]):
        if (proc.info["name"] or "").startswith("postgres"):
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                seconds += t.user + t.system
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", help="NAME=SOURCE_TREE, e.g. before=/tmp/before after=.")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3000, help="concurrent requests a round")
    parser.add_argument("--sequential", type=int, default=300, help="sequential requests a round")
    parser.add_argument("--postgres", action="store_true", help="a fresh PostgreSQL database a round, not SQLite")
    parser.add_argument("--agent", action="store_true", help="an agent's request: system prompt and six tools")
    parser.add_argument("--stream", action="store_true", help="answers streamed: an SSE event a token, read to the end")
    parser.add_argument(
        "--api", choices=["chat", "responses", "messages"], default="chat", help="the API (and route) each request uses"
    )
    parser.add_argument(
        "--front", action="store_true", help="each version's `areal-proxy front` over its replica: the front measured"
    )
    args = parser.parse_args()
    versions = [(name, Path(path).resolve()) for name, path in (v.split("=", 1) for v in args.versions)]
    tmp = Path(tempfile.mkdtemp(prefix="areal-ab-"))
    results: dict[str, list[dict]] = {name: [] for name, _ in versions}
    with instant_engine(tmp) as engine_url:
        for r in range(args.rounds):
            for name, source in versions:
                with contextlib.ExitStack() as stack:
                    db = stack.enter_context(fresh_pg_database()) if args.postgres else f"sqlite:///{tmp}/{name}-{r}.db"
                    row = one_round(name, source, engine_url, db, args, tmp)
                results[name].append(row)
                server = (
                    f", PostgreSQL server {row['db_cpu_ms']:.3f} ms CPU a request"
                    if args.postgres
                    else f", SQLite log at most {row['wal_mb']:.0f} MB"
                )
                print(
                    f"round {r} {name}: {row['rps']:.0f} req/s, {row['cpu_ms']:.3f} ms CPU a request{server}, "
                    f"sequential p50 {row['seq_p50_ms']:.2f} ms, p99/p50 at 32 {row['p99_over_p50']:.2f}",
                    flush=True,
                )
    server_head = " PostgreSQL server CPU |" if args.postgres else " SQLite log, largest |"
    print(f"| version | req/s at 32 (median) | CPU per request |{server_head} sequential p50 | p99/p50 | rounds |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, rows in results.items():
        rps = statistics.median(r["rps"] for r in rows)
        cpu = statistics.median(r["cpu_ms"] for r in rows)
        if args.postgres:
            server = f" {statistics.median(r['db_cpu_ms'] for r in rows):.2f} ms |"
        else:
            server = f" {max(r['wal_mb'] for r in rows):.0f} MB |"
        seq = statistics.median(r["seq_p50_ms"] for r in rows)
        tail = statistics.median(r["p99_over_p50"] for r in rows)
        each = ", ".join(f"{r['rps']:.0f}" for r in rows)
        print(f"| {name} | {rps:,.0f} | {cpu:.2f} ms |{server} {seq:.2f} ms | {tail:.2f} | {each} |")


if __name__ == "__main__":
    main()
