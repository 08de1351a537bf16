"""The trainer's algorithms compared on the CPU arithmetic task: held-out accuracy after the same wall-clock minutes.

For each `--algorithm` (a recipe in `RECIPES`: its `--set` overrides on the shipped config) it runs
`areal-proxy train examples/arithmetic/config.toml` (the same rollouts, claims and checkpoints;
`trainer.max_minutes` = `--minutes`, so a decayed schedule ends with the run), stops it after `--minutes` of
wall clock (Ctrl-C semantics: the trainer checkpoints), and evaluates the last checkpoint on the example's
held-out problems, sampled at T=1 and greedy. Each result is written to `<out>/<algorithm>.json` and the table
of every result in `<out>` to `<out>/results.md`, so recipes can be run one invocation at a time and still land
in one table (`--eval-only` evaluates runs already trained). `distill` learns from a teacher: `--teacher`, or
else the checkpoint of this invocation's (or an earlier) `grpo` run, so run `grpo` first.

    python benchmarks/learning_algorithms.py --minutes 30 --baseline --out docs/experiments/algorithms  # every recipe
    python benchmarks/learning_algorithms.py --algorithm dpo --minutes 3 --max-tasks 40 --out /tmp/smoke  # smoke

`--set` overrides go to every run; `--dpo-set`, `--ppo-critic-set`, ... to one recipe's run.
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

# Each recipe: the shipped config (GRPO with clip-higher, dynamic sampling's zero-variance skip and a screen)
# plus these overrides.
RECIPES: dict[str, list[str]] = {
    "grpo": [],
    # PPO with a learned value (a head on the policy's body, trained beside it) and GAE over each tree.
    "ppo-critic": ["trainer.critic.lam=0.95", "trainer.critic.value_coef=0.5"],
    # DAPO's full recipe: clip-higher (shipped), dynamic sampling that refills the batch, token-level loss
    # (shipped), and the soft overlong penalty over the last 4 of the agent's 16 tokens.
    "dapo": ["trainer.batch.fill=true", "trainer.overlong.max_tokens=16", "trainer.overlong.buffer=4"],
    # M2PO's second-moment trust region, at twice the shipped staleness (which alone collapsed at 3+).
    "m2po": ["trainer.loss.m2po_tau=0.04", "trainer.max_staleness=4"],
    "dpo": ["trainer.algorithm=dpo"],
    "sft": ["trainer.algorithm=sft"],
    "distill": ["trainer.algorithm=distill"],  # + trainer.distill.teacher (main)
}
ALGORITHMS = tuple(RECIPES)


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
        f"trainer.max_minutes={args.minutes}",
        "trainer.checkpoint.every=5",
        "eval.every_minutes=0",  # evaluated here after the run, not on its clock
        *RECIPES[algorithm],
        *args.overrides,
        *getattr(args, f"{algorithm.replace('-', '_')}_overrides"),
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
    t0 = steps[0]["time"] - steps[0].get("wait_s", 0) - steps[0].get("train_s", 0) if steps else started
    return {
        "algorithm": algorithm,
        "curve": [[round((r["time"] - t0) / 60, 2), r["reward_mean"]] for r in steps],
        "overrides": overrides[2:],
        "minutes": round(wall, 1),
        "steps": max((r["step"] for r in steps), default=0),
        "trained_steps": sum(1 for r in steps if "loss" in r),
        "sessions": sum(r["sessions"] for r in steps),
        "train_reward": sum(r["reward_mean"] for r in steps[-5:]) / max(len(steps[-5:]), 1),
        "trainer_peak_rss_gib": round(peak, 2),
        "checkpoint": str(newest_checkpoint(run_dir) or ""),
    }


def teacher(args: argparse.Namespace, out: Path) -> str:
    """`--teacher`, else the checkpoint the grpo run in `out` ended with."""
    if args.teacher:
        return args.teacher
    grpo = out / "grpo.json"
    if not grpo.is_file() or not json.loads(grpo.read_text())["checkpoint"]:
        raise SystemExit("distill needs a teacher: pass --teacher CHECKPOINT or run grpo first (same --out)")
    return json.loads(grpo.read_text())["checkpoint"]


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


def plot(out: Path) -> None:
    """Each run's training reward (mean over a step's sessions, a 5-step moving mean) against its minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for path in sorted(out.glob("*.json")):
        result = json.loads(path.read_text())
        curve = result.get("curve")
        if not curve:
            continue
        xs, ys = [c[0] for c in curve], [c[1] for c in curve]
        smooth = [sum(ys[max(0, i - 4) : i + 1]) / len(ys[max(0, i - 4) : i + 1]) for i in range(len(ys))]
        held = (result.get("eval") or {}).get("sampled")
        label = result["algorithm"] + (f" (held-out {held:.0%})" if held is not None else "")
        ax.plot(xs, smooth, "-", label=label)
    ax.set_xlabel("minutes of training (2 CPU cores)")
    ax.set_ylabel("training reward (5-step mean)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title("SmolLM2-135M-Instruct on two-digit arithmetic, one run per recipe", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=120)


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
        parser.add_argument(f"--{name}-set", dest=f"{name.replace('-', '_')}_overrides", action="append", default=[])
    parser.add_argument("--teacher", default="", help="distill's teacher checkpoint (default: the grpo run's)")
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
            if algorithm == "distill":
                args.distill_overrides.append(f"trainer.distill.teacher={teacher(args, out)}")
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
    plot(out)
    print(report)


if __name__ == "__main__":
    main()
