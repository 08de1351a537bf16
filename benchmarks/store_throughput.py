"""Completions recorded per second by 1, 2 and 4 writer processes, on SQLite and on PostgreSQL.

Each writer process stands for one proxy replica: one `Database` with its group-commit writer
and `--concurrency` calls in flight, each recording one completion exactly as a model call
does — `proxy.store.turns.record_turn` with the row `CompletionService.record` builds (~100
prompt and ~100 output token ids as int32 blobs, float32 logprobs, per-token versions, the
request and reply as JSON) and its session's counters — continuing the chain of its session.
SQLite is one file shared by all writers (WAL, synchronous=FULL; each commit takes the write
lock, so the processes take turns); PostgreSQL is a fresh database on the given server.

    .venv/bin/python benchmarks/store_throughput.py                  # both stores, 1/2/4 writers, 10 s each
    .venv/bin/python benchmarks/store_throughput.py --stores postgresql --seconds 20

Prints a markdown table: completions/s over all writers, commits/s, completions per commit
(group-commit batching), and the latency of one recording (p50 / p99).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import secrets
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.store.config import StoreConfig  # noqa: E402
from proxy.store.db import Database  # noqa: E402
from proxy.store.sessions import auto_session_row, insert_sessions  # noqa: E402
from proxy.store.tokens import pack_floats, pack_ints  # noqa: E402
from proxy.store.turns import record_turn  # noqa: E402

TOKENS = 100


def completion_row(session_id: str, parent_id: str | None, depth: int, rng: random.Random) -> dict:
    """A row shaped like the ones `CompletionService.record` writes (cheap to make: the store is measured)."""
    response_id = f"chatcmpl-{rng.getrandbits(96):024x}"
    ids = np.random.default_rng(rng.getrandbits(32))
    return {
        "id": response_id,
        "session_id": session_id,
        "parent_id": parent_id,
        "response_id": response_id,
        "choice_index": 0,
        "api": "chat",
        "depth": depth,
        "chain_hash": f"{rng.getrandbits(256):064x}",
        "request": {
            "messages": [{"role": "user", "content": f"What is {rng.randint(10, 99)} + {rng.randint(10, 99)}?"}],
            "num_messages": 2 * depth + 1,
            "tools": None,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": TOKENS},
            "model": "smollm2",
        },
        "response": {"role": "assistant", "content": "The answer is " + str(rng.randint(20, 198)) + "."},
        "prompt_ids": pack_ints(ids.integers(0, 49152, TOKENS)),
        "prompt_len": TOKENS * (2 * depth + 1),
        "output_ids": pack_ints(ids.integers(0, 49152, TOKENS)),
        "output_logprobs": pack_floats(-3 * ids.random(TOKENS)),
        "output_versions": pack_ints(np.zeros(TOKENS, dtype=np.int32)),
        "finish_reason": "stop",
        "temperature": 1.0,
        "created_at": time.time(),
    }


async def _record_loop(db: Database, session_id: str, deadline: float, latencies: list[float]) -> int:
    rng = random.Random(session_id)
    parent, depth, done = None, 0, 0
    while time.time() < deadline:
        row = completion_row(session_id, parent, depth, rng)
        started = time.perf_counter()
        await db.write(
            lambda conn, row=row: record_turn(conn, session_id, [row], time.time(), (0, 0), new_auto_session=False)
        )
        latencies.append(time.perf_counter() - started)
        parent, depth, done = row["id"], depth + 1, done + 1
    return done


def writer(url: str, concurrency: int, start_at: float, seconds: float, results: mp.Queue) -> None:
    db = Database(StoreConfig(url=url, pool_size=4, max_overflow=4))
    session_ids = [f"sess_bench_{os.getpid()}_{i}" for i in range(concurrency)]
    now = time.time()
    db.transaction(lambda c: insert_sessions(c, [{**auto_session_row(s, now), "auto": False} for s in session_ids]))
    db.start_writer()
    latencies: list[float] = []

    async def run() -> int:
        await asyncio.sleep(max(0.0, start_at - time.time()))
        deadline = start_at + seconds
        counts = await asyncio.gather(*(_record_loop(db, s, deadline, latencies) for s in session_ids))
        return sum(counts)

    done = asyncio.run(run())
    db.close()
    results.put((done, db.commits, latencies))


def measure(url: str, writers: int, concurrency: int, seconds: float) -> dict:
    Database(StoreConfig(url=url)).close()  # migrate once, before the writers race
    ctx = mp.get_context("spawn")
    results: mp.Queue = ctx.Queue()
    start_at = time.time() + 8.0  # every process imported and connected by then
    procs = [ctx.Process(target=writer, args=(url, concurrency, start_at, seconds, results)) for _ in range(writers)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join()
    done = sum(o[0] for o in outcomes)
    commits = sum(o[1] for o in outcomes)
    latencies = sorted(x for o in outcomes for x in o[2])
    return {
        "completions_per_s": done / seconds,
        "commits_per_s": commits / seconds,
        "per_commit": done / max(commits, 1),
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
    }


def fresh_pg(admin_url: str) -> tuple[str, str]:
    import psycopg

    name = "areal_bench_" + secrets.token_hex(4)
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    return name, f"{base}/{name}"


def drop_pg(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--writers", default="1,2,4", help="writer process counts to measure")
    parser.add_argument("--concurrency", type=int, default=32, help="recordings in flight per writer process")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per row of the table")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/postgres", help="PostgreSQL admin URL")
    args = parser.parse_args()
    rows = []
    for store in args.stores.split(","):
        for writers in [int(w) for w in args.writers.split(",")]:
            if store == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    result = measure(f"sqlite:///{tmp}/bench.db", writers, args.concurrency, args.seconds)
            else:
                name, url = fresh_pg(args.pg)
                try:
                    result = measure(url, writers, args.concurrency, args.seconds)
                finally:
                    drop_pg(args.pg, name)
            rows.append((store, writers, result))
            print(f"{store} × {writers}: {result['completions_per_s']:.0f} completions/s", file=sys.stderr)
    print(f"\n{os.cpu_count()} CPUs; {args.concurrency} recordings in flight per writer; {args.seconds:g} s each\n")
    print("| store | writer processes | completions/s | commits/s | completions/commit | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for store, writers, r in rows:
        print(
            f"| {store} | {writers} | {r['completions_per_s']:.0f} | {r['commits_per_s']:.0f} | "
            f"{r['per_commit']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
        )


if __name__ == "__main__":
    main()
