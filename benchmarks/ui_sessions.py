"""The web UI's sessions page over 100,000 recorded sessions, on SQLite and on PostgreSQL.

Fills a store with `--sessions` sessions as a long run leaves them (groups of 8 created together,
mostly consumed, some failed or waiting, 5% evaluation, rewards, a policy version that rises over
the run), starts `areal-proxy ui` on it, and times over HTTP what the sessions page asks:

  first page      GET /ui/api/sessions (50 newest, with the capped count)
  filtered page   status=consumed, training only, reward >= 0.5, versions 40..60 (and its count)
  deep page       the 50 sessions below the 90,000th, by the cursor the "older" button sends
  counts          GET /ui/api/overview (sessions per status and per fate, the page's header)

each as the median and p95 of `--repeats` requests after two warm-ups, then the whole page in
headless Chromium: from navigation to the table drawn, first and deep page, median of 5 loads.
For contrast, the store-level cost of the control API's listing at the same depth (`GET
/sessions?offset=90000`: OFFSET paging plus an exact count) is timed too.

    .venv/bin/python benchmarks/ui_sessions.py                       # both stores, 100k sessions
    .venv/bin/python benchmarks/ui_sessions.py --stores sqlite --sessions 20000

PostgreSQL runs in a schema of its own on the given server (dropped afterwards); SQLite in a
temporary file. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy.store.browse import Cursor  # noqa: E402
from proxy.store.config import StoreConfig  # noqa: E402
from proxy.store.db import Database  # noqa: E402
from proxy.store.sessions import count_sessions, insert_sessions, recent_sessions  # noqa: E402
from proxy.ui.schemas import encode_cursor  # noqa: E402
from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy  # noqa: E402

GROUP = 8
SCHEMA = "ui_bench"
FILTERED = {"status": "consumed", "eval": "false", "reward_min": 0.5, "version_min": 40, "version_max": 60}


def session_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    start = time.time() - n * 0.5
    rows = []
    for i in range(n):
        group = i // GROUP
        status = rng.choices(["consumed", "failed", "finished", "open"], weights=[85, 8, 5, 2])[0]
        version = group * 100 // (n // GROUP)  # 0..99 over the run
        evaluation = rng.random() < 0.05
        rows.append(
            {
                "id": f"sess_{rng.getrandbits(96):024x}",
                "key_hash": f"{rng.getrandbits(256):064x}",
                "task_id": f"task-{group % 5000}",
                "group_id": f"task-{group % 5000}@{group}",
                "metadata": {},
                "status": status,
                "auto": False,
                "eval": evaluation,
                "reward": None if status in ("failed", "open") else rng.choice([0.0, 0.0, 0.3, 1.0]),
                "failure": "episode timed out" if status == "failed" else None,
                "num_completions": rng.randint(1, 6),
                "min_version": None if status == "open" else version,
                "max_version": None if status == "open" else version + rng.randint(0, 1),
                "created_at": start + group * 4.0,
                "updated_at": start + group * 4.0 + 3.0,
                "finished_at": None if status == "open" else start + group * 4.0 + 3.0,
                "claimed_step": group // 16 if status == "consumed" and not evaluation else None,
                "consumed_step": group // 16 if status == "consumed" and not evaluation else None,
            }
        )
    return rows


def fill(url: str, n: int) -> Database:
    db = Database(StoreConfig(url=url))
    rows = session_rows(n)
    for i in range(0, n, 5000):
        db.transaction(lambda c, chunk=rows[i : i + 5000]: insert_sessions(c, chunk))
    if db.engine.dialect.name == "postgresql":
        db.transaction(lambda c: c.exec_driver_sql("ANALYZE sessions"))
    return db


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and p95 of `fn` in milliseconds, after two warm-up calls."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]


def deep_cursor(db: Database, depth: int) -> str:
    from sqlalchemy import select

    from proxy.store.schema import sessions

    row = db.read(
        lambda c: c.execute(
            select(sessions.c.created_at, sessions.c.id)
            .order_by(sessions.c.created_at.desc(), sessions.c.id.desc())
            .offset(depth)
            .limit(1)
        ).one()
    )
    return encode_cursor(Cursor(row.created_at, row.id))


def browser_loads(base: str, routes: dict[str, str], loads: int) -> dict[str, float]:
    """Median milliseconds from navigation to the sessions table drawn, per route."""
    from playwright.sync_api import sync_playwright

    out = {}
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=os.environ.get("AREAL_CHROMIUM", "/usr/bin/chromium"))
        for name, route in routes.items():
            samples = []
            for i in range(loads + 1):
                page = chromium.new_page()
                t = time.perf_counter()
                page.goto(f"{base}/ui/#{route}")
                page.wait_for_function("h => document.querySelector('#main').dataset.rendered === h", arg=f"#{route}")
                page.wait_for_selector("#sessions tbody tr")
                if i:  # the first load warms the server's and the browser's caches
                    samples.append((time.perf_counter() - t) * 1000)
                page.close()
            out[name] = statistics.median(samples)
        chromium.close()
    return out


def measure(store: str, url: str, n: int, repeats: int, tmp: Path) -> list[tuple[str, str]]:
    t = time.perf_counter()
    db = fill(url, n)
    print(f"{store}: {n} sessions written in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    cursor = deep_cursor(db, int(n * 0.9))
    port = free_port()
    log = tmp / f"ui-{store}.log"
    argv = [sys.executable, "-m", "proxy.cli", "ui", "--db", url, "--port", str(port), "--run-dir", str(tmp)]
    proc = start_process(argv, log, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    results = []
    try:
        wait_healthy(base, proc, timeout=120, log_path=log)
        with httpx.Client(base_url=base, timeout=60) as client:

            def get(path: str, **params: object) -> Callable[[], object]:
                def call() -> object:
                    r = client.get(path, params=params)
                    r.raise_for_status()
                    return r.json()

                return call

            first = get("/ui/api/sessions")()
            counted = first["total_capped"] if n > first["total"] else first["total"] == n
            assert len(first["data"]) == 50 and counted, first
            cases = {
                "first page (50 newest + capped count)": get("/ui/api/sessions"),
                "filtered page (+ its count)": get("/ui/api/sessions", **FILTERED),
                f"deep page (below row {int(n * 0.9):,})": get("/ui/api/sessions", older_than=cursor, count="false"),
                "header counts (/ui/api/overview)": get("/ui/api/overview"),
            }
            for name, call in cases.items():
                p50, p95 = timed(call, repeats)
                results.append((f"{store} · {name}", f"{p50:.1f} / {p95:.1f} ms"))
        offset = int(n * 0.9)
        p50, p95 = timed(lambda: db.read(lambda c: (recent_sessions(c, None, 50, offset), count_sessions(c, None))), 5)
        name = f"{store} · control API listing at offset {offset:,} (store only)"
        results.append((name, f"{p50:.1f} / {p95:.1f} ms"))
        loads = browser_loads(base, {"first page": "/sessions", "deep page": f"/sessions?older_than={cursor}"}, 5)
        for name, ms in loads.items():
            results.append((f"{store} · Chromium: {name}, navigation to table drawn", f"{ms:.0f} ms (median of 5)"))
    finally:
        stop_process(proc, 20)
        db.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=20, help="timed requests per case")
    parser.add_argument("--pg", default="postgresql+psycopg://root@127.0.0.1:5432/test", help="PostgreSQL server")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores.split(","):
            if store == "sqlite":
                results += measure(store, f"sqlite:///{tmp}/ui.db", args.sessions, args.repeats, Path(tmp))
            elif store == "postgresql":
                on_pg = partial(measure, "postgresql", n=args.sessions, repeats=args.repeats, tmp=Path(tmp))
                results += with_schema(args.pg, lambda url, run=on_pg: run(url=url))
            else:
                parser.error(f"unknown store {store!r}")
    print("| what | p50 / p95 |\n|---|---|")
    for name, value in results:
        print(f"| {name} | {value} |")
    return 0


def with_schema(url: str, run: Callable[[str], list]) -> list:
    """`run` on a store in a schema of its own on `url`'s server, dropped afterwards."""
    from sqlalchemy import create_engine, text

    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(text(f"CREATE SCHEMA {SCHEMA}"))
    sep = "&" if "?" in url else "?"
    try:
        return run(f"{url}{sep}options=-csearch_path%3D{SCHEMA}")
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        admin.dispose()


if __name__ == "__main__":
    sys.exit(main())
