"""PPO, DPO and SFT compared on the CPU arithmetic task: held-out accuracy after the same wall-clock minutes.

For each `--algorithm` it runs `areal-proxy train examples/arithmetic/config.toml` with
`trainer.algorithm` set (the same rollouts, claims and checkpoints; `trainer.max_minutes` = `--minutes`, so a
decayed schedule ends with the run), stops it after `--minutes` of wall clock (Ctrl-C semantics: the trainer
checkpoints), and evaluates the last checkpoint on the example's held-out problems, sampled at T=1 and greedy.
Each algorithm's result is written to `<out>/<algorithm>.json` and the table of every result in `<out>` to
`<out>/results.md`, so algorithms can be run one invocation at a time and still land in one table
(`--eval-only` evaluates runs already trained, for a machine where training and evaluating at once take too long).

    python benchmarks/learning_algorithms.py --algorithm dpo sft ppo --minutes 30 --out docs/experiments/algorithms
    python benchmarks/learning_algorithms.py --algorithm dpo --minutes 3 --max-tasks 40 --out /tmp/smoke  # smoke

`--set` overrides go to every run; `--dpo-set`, `--sft-set`, `--ppo-set` to one algorithm's run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

from learning_arithmetic import newest_checkpoint, trainer_peak_rss  # noqa: E402

from proxy.sections import DEVICES  # noqa: E402
from trainer.launch.processes import start_process  # noqa: E402

ALGORITHMS = ("ppo", "dpo", "sft")


def held_out(model: str, db: str, device: str, temperature: float, max_tasks: int) -> dict:
    """`areal-proxy eval` of the example's held-out problems (the first `max_tasks`; 0: all 200), one answer each."""
    out = Path(db.removeprefix("sqlite:///")).with_suffix(f".{time.time_ns()}.json")
    cmd = [sys.executable, "-m", "proxy.cli", "eval", str(REPO / "examples/arithmetic/config.toml")]
    cmd += ["--model", model, "--samples", "1", "--temperature", str(temperature), "--device", device]
    cmd += ["--db", db, "--out", str(out)] + (["--max-tasks", str(max_tasks)] if max_tasks else [])
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"evaluating {model} failed:\n{done.stderr[-3000:]}")
    report = json.loads(out.read_text())["report"]
    return {"accuracy": report["accuracy"]["value"], "tasks": report["tasks"]}


def evaluate(model: str, db: str, device: str, max_tasks: int) -> dict:
    sampled = held_out(model, db, device, 1.0, max_tasks)
    greedy = held_out(model, db, device, 0.0, max_tasks)
    return {"sampled": sampled["accuracy"], "greedy": greedy["accuracy"], "problems": sampled["tasks"]}


def train(algorithm: str, args: argparse.Namespace, run_dir: Path) -> dict:
    """One run of `--minutes` wall clock: its steps, sessions trained and peak trainer memory."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "proxy.cli", "train", args.config, "--device", args.device]
    overrides = [
        f"trainer.run_dir={run_dir}",
        f"store.url=sqlite:///{run_dir}/areal.db",
        f"trainer.algorithm={algorithm}",
        f"trainer.max_minutes={args.minutes}",
        "trainer.checkpoint.every=5",
        "eval.every_minutes=0",  # evaluated here after the run, not on its clock
        *args.overrides,
        *getattr(args, f"{algorithm}_overrides"),
    ]
    for o in overrides:
        cmd += ["--set", o]
    started = time.time()
    peak = 0.0
    proc = start_process(cmd, run_dir / "train.out", cwd=REPO, env={"HF_HUB_OFFLINE": "1"})
    while time.time() - started < 60 * args.minutes and proc.poll() is None:
        peak = trainer_peak_rss(proc, peak)
        time.sleep(5)
    peak = trainer_peak_rss(proc, peak)
    proc.send_signal(signal.SIGINT)
    proc.wait(600)
    wall = (time.time() - started) / 60
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steps = [r for r in rows if "sessions" in r]
    return {
        "algorithm": algorithm,
        "overrides": overrides[2:],
        "minutes": round(wall, 1),
        "steps": max((r["step"] for r in steps), default=0),
        "trained_steps": sum(1 for r in steps if "loss" in r),
        "sessions": sum(r["sessions"] for r in steps),
        "train_reward": sum(r["reward_mean"] for r in steps[-5:]) / max(len(steps[-5:]), 1),
        "trainer_peak_rss_gib": round(peak, 2),
        "checkpoint": str(newest_checkpoint(run_dir) or ""),
    }


def table(out: Path) -> str:
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    rows = [
        "| run | wall minutes | steps (trained) | sessions | train reward (last 5 steps) | held-out sampled (T=1) | "
        "held-out greedy | problems | trainer peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r["algorithm"] != "untrained", r["algorithm"])):
        ev = r.get("eval") or {}
        acc = (f"{ev['sampled']:.1%}", f"{ev['greedy']:.1%}", str(ev["problems"])) if ev else ("-", "-", "-")
        if r["algorithm"] == "untrained":
            rows.append(f"| untrained | 0 | - | - | - | {acc[0]} | {acc[1]} | {acc[2]} | - |")
            continue
        rows.append(
            f"| {r['algorithm']} | {r['minutes']} | {r['steps']} ({r['trained_steps']}) | {r['sessions']} | "
            f"{r['train_reward']:.3f} | {acc[0]} | {acc[1]} | {acc[2]} | {r['trainer_peak_rss_gib']:.2f} GiB |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    parser.add_argument("--minutes", type=float, default=30, help="wall-clock minutes of each run")
    parser.add_argument("--config", default=str(REPO / "examples/arithmetic/config.toml"))
    parser.add_argument("--run-dir", default=str(REPO / "runs/learning_algorithms"))
    parser.add_argument("--out", default=str(REPO / "docs/experiments/algorithms"))
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="engine and trainer device (evaluations too)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="override for every run")
    for name in ALGORITHMS:
        parser.add_argument(f"--{name}-set", dest=f"{name}_overrides", action="append", default=[])
    parser.add_argument("--max-tasks", type=int, default=0, help="evaluate on the first N held-out problems (0: all)")
    parser.add_argument("--skip-eval", action="store_true", help="no held-out evaluation: the runs' steps only")
    parser.add_argument(
        "--eval-only", action="store_true", help="evaluate the runs already in --out (and --run-dir), training none"
    )
    parser.add_argument("--baseline", action="store_true", help="also evaluate the untrained model")
    args = parser.parse_args()
    from proxy.runtime.model_files import DEFAULT_MODEL

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = Path(args.run_dir)
    evals_db = f"sqlite:///{root.resolve()}/evals.db"  # evaluation sessions, apart from the runs'
    root.mkdir(parents=True, exist_ok=True)
    if args.baseline and not args.skip_eval:
        base = {"algorithm": "untrained", "eval": evaluate(DEFAULT_MODEL, evals_db, args.device, args.max_tasks)}
        (out / "untrained.json").write_text(json.dumps(base, indent=2))
    for algorithm in args.algorithm:
        if args.eval_only:
            result = json.loads((out / f"{algorithm}.json").read_text())
        else:
            print(f"training with {algorithm} for {args.minutes} minutes ...", flush=True)
            result = train(algorithm, args, root / algorithm)
            (out / f"{algorithm}.json").write_text(json.dumps(result, indent=2))
        if not args.skip_eval and result["checkpoint"]:
            print(f"evaluating {result['checkpoint']} ...", flush=True)
            result["eval"] = evaluate(result["checkpoint"], evals_db, args.device, args.max_tasks)
        print(json.dumps(result), flush=True)
        (out / f"{algorithm}.json").write_text(json.dumps(result, indent=2))
    report = table(out)
    (out / "results.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
