"""Online RL learning run: `areal-proxy train --online` on the arithmetic assistant, users rating answers.

Starts `areal-proxy train --online examples/online/config.toml` in a fresh run directory, then the
simulated users of `examples/online/users.py` (a plain `openai` client with one fixed key, and thumbs
up or down posted by response id for each answer) until the trainer's `max_minutes` are spent. Prints
the held-out accuracy the trainer's `[eval]` measured (the arithmetic example's 200 held-out problems,
sampled at T=1) at the start, every `eval.every_minutes` and at the end, the users' live accuracy per
minute, and the online episode counts.

    python benchmarks/online_arithmetic.py --minutes 15 --users 32 --out docs/experiments/curves/online.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="training budget (trainer.max_minutes)")
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--rate", type=float, default=1.0, help="share of answers the users rate")
    parser.add_argument("--eval-every", type=float, default=5.0, help="eval.every_minutes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra config override")
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="online-arith-"))
    port = free_port()
    overrides = {
        "proxy.port": port,
        "store.url": f"sqlite:///{tmp}/areal.db",
        "trainer.run_dir": str(tmp / "run"),
        "trainer.max_minutes": args.minutes,
        "eval.every_minutes": args.eval_every,
    }
    argv = [sys.executable, "-m", "proxy.cli", "train", "--online", "examples/online/config.toml"]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    for extra in args.overrides:
        argv += ["--set", extra]
    log = tmp / "train.log"
    started = time.time()
    train = start_process(argv, log, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, train, timeout=600, log_path=log)
        users = subprocess.run(
            [sys.executable, "examples/online/users.py", url, "--minutes", str(args.minutes),
             "--users", str(args.users), "--rate", str(args.rate)],
            cwd=REPO, capture_output=True, text=True, timeout=60 * (args.minutes + 30),
        )  # fmt: skip
        code = train.wait(timeout=600)
    finally:
        stop_process(train, 120)
    metrics = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines() if x]
    keep = ("step", "eval_accuracy", "eval_accuracy_low", "eval_accuracy_high", "eval_version")
    evals = [{k: m[k] for k in keep if k in m} for m in metrics if "eval_accuracy" in m]
    steps = [m for m in metrics if "reward_mean" in m]
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "minutes": args.minutes,
        "users": args.users,
        "rate": args.rate,
        "train_exit": code,
        "wall_s": round(time.time() - started),
        "steps": len(steps),
        "sessions_trained": sum(m.get("sessions", 0) for m in steps),
        "reward_mean_by_step": [round(m["reward_mean"], 3) for m in steps],
        "eval": evals,
        "users_stats": json.loads(users.stdout.strip().splitlines()[-1])
        if users.stdout.strip()
        else users.stderr[-2000:],
        "run_dir": str(tmp),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
