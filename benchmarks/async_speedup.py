"""Synchronous (max_staleness = 0) vs asynchronous (max_staleness = 2) training, same steps.

Runs `areal-proxy train` twice on an agent workload whose tool call takes real
time (benchmarks/slow_tool_agent.py: a forced tool call, a sleep standing in for
the environment, a final answer), with the same seeds and the same number of
training steps, and reports the wall time of each and their ratio.

    python benchmarks/async_speedup.py --steps 8 --tool-seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def config(tmp: Path, name: str, staleness: int, args: argparse.Namespace) -> Path:
    run_dir = tmp / name
    path = tmp / f"{name}.toml"
    path.write_text(
        f"""
[proxy]
port = 0
[engine]
max_batch_size = 64
[store]
url = "sqlite:///{run_dir}/areal.db"
[rollout]
dataset = "{REPO}/examples/arithmetic/agent.py:tasks"
agent = "{REPO}/benchmarks/slow_tool_agent.py:run"
reward_fn = "math_exact"
group_size = {args.group_size}
concurrency = 64
[trainer]
max_staleness = {staleness}
max_steps = {args.steps}
run_dir = "{run_dir}"
[trainer.batch]
size = {args.batch_size}
[trainer.checkpoint]
every = 1000
"""
    )
    return path


def run(path: Path, tool_seconds: float) -> float:
    env = {**os.environ, "AREAL_TOOL_SECONDS": str(tool_seconds), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "train", str(path)], env=env, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{path.name} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--tool-seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="areal-async-") as tmp:
        tmp = Path(tmp)
        sync = run(config(tmp, "sync", 0, args), args.tool_seconds)
        asyn = run(config(tmp, "async", 2, args), args.tool_seconds)
        staleness = [
            json.loads(line).get("staleness_mean", 0)
            for line in (tmp / "async" / "metrics.jsonl").read_text().splitlines()
            if "staleness_mean" in line
        ]
    result = {
        "steps": args.steps,
        "batch_size": args.batch_size,
        "tool_seconds": args.tool_seconds,
        "sync_s": round(sync, 1),
        "async_s": round(asyn, 1),
        "speedup": round(sync / asyn, 2),
        "async_staleness_mean": round(sum(staleness) / max(len(staleness), 1), 2),
    }
    print(json.dumps(result, indent=2))
    print(
        f"\n| mode | wall time (s) |\n|---|---|\n| sync (max_staleness=0) | {sync:.1f} |\n"
        f"| async (max_staleness=2) | {asyn:.1f} |\n| **speedup** | **{sync / asyn:.2f}×** |"
    )


if __name__ == "__main__":
    main()
