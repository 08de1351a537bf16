"""Held-out arithmetic accuracy before and after a fixed wall-clock budget of training on CPU.

1. evaluates the untrained model on the 200 held-out problems (`areal-proxy eval`, sampled at T=1,
   and greedy);
2. runs `areal-proxy train examples/arithmetic/config.toml` for `--minutes`, copying the
   newest checkpoint's weights every `--snapshot-minutes`;
3. stops the run (Ctrl-C semantics: the trainer checkpoints), evaluates every snapshot and the
   final weights, and writes the curve (PNG) and a markdown table.

    python benchmarks/learning_arithmetic.py --minutes 30 --out examples/arithmetic
    python benchmarks/learning_arithmetic.py --minutes 30 --lora --out docs/experiments/lora   # LoRA adapters

The trainer process's peak resident memory (VmHWM) is recorded too, for comparing settings.
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
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from proxy.sections import DEVICES  # noqa: E402
from trainer.launch.processes import start_process  # noqa: E402

SKIP = ("trainer.pt", "trainer_state.json", "adapter")  # optimizer state and the adapter are not needed to evaluate
LORA = "{rank = 16, alpha = 32.0}"
LORA_LR = 2e-4  # LoRA's best learning rate is about 10x full fine-tuning's (Schulman et al., "LoRA Without Regret")


def trainer_peak_rss(proc: Any, peak: float) -> float:
    """The largest peak RSS (VmHWM, GiB) of `proc`'s trainer descendants seen so far."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        return peak
    for child in children:
        try:
            if "trainer.loop" not in " ".join(child.cmdline()):
                continue
            status = Path(f"/proc/{child.pid}/status").read_text()
        except (psutil.Error, OSError):
            continue
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]) / 2**20)
    return peak  # optimizer state is not needed to evaluate


def _eval(model: str, samples: int, temperature: float, device: str, db: str) -> dict:
    """`areal-proxy eval` of the example's 200 held-out problems: its proxy and engine are processes of their
    own, whose memory is given back when they end (two runs side by side were OOM-killed when it stayed)."""
    out = Path(db.removeprefix("sqlite:///")).with_suffix(f".{time.time_ns()}.json")
    cmd = [sys.executable, "-m", "proxy.cli", "eval", str(REPO / "examples/arithmetic/config.toml")]
    cmd += ["--model", model, "--samples", str(samples), "--temperature", str(temperature), "--device", device]
    cmd += ["--db", db, "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"evaluating {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())["report"]


def evaluate(model: str, db: str, samples: int = 1, device: str = "cpu") -> dict:
    """Held-out accuracy sampled at T=1 (`samples` answers a problem) and greedy, and the right answers
    per operation (sampled, per answer asked)."""
    sampled = _eval(model, samples, 1.0, device, db)
    greedy = _eval(model, 1, 0.0, device, db)
    kinds = sampled["by"]["kind"]
    return {
        "sampled": sampled["accuracy"]["value"],
        "greedy": greedy["accuracy"]["value"],
        "sampled_add_correct": kinds["addition"]["solved"] / samples,
        "sampled_sub_correct": kinds["subtraction"]["solved"] / samples,
        "pass_at_k": sampled["pass_at_k"],
        "problems": sampled["tasks"],
    }


def newest_checkpoint(run_dir: Path) -> Path | None:
    root = run_dir / "checkpoints"
    done = sorted(p for p in root.glob("step_*") if (p / "trainer_state.json").is_file()) if root.is_dir() else []
    return done[-1] if done else None


def snapshot(run_dir: Path, snaps: Path, minute: float) -> dict | None:
    ckpt = newest_checkpoint(run_dir)
    if ckpt is None:
        return None
    target = snaps / f"{minute:05.1f}min_{ckpt.name}"
    shutil.copytree(ckpt, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*SKIP))
    state = json.loads((ckpt / "trainer_state.json").read_text())
    return {"minute": minute, "path": str(target), "step": state["step"]}


def plot(metrics: list[dict], evals: list[dict], out: Path, where: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m for m in metrics if "reward_mean" in m]
    t0 = steps[0]["time"] if steps else 0
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        xs = [(m["time"] - t0) / 60 for m in steps]
        window = 5
        ys = [
            sum(s["reward_mean"] for s in steps[max(0, i - window + 1) : i + 1])
            / len(steps[max(0, i - window + 1) : i + 1])
            for i in range(len(steps))
        ]
        ax.plot(xs, ys, label="train reward (T=1, 5-step mean)", color="tab:blue")
    minutes = [e["minute"] for e in evals]
    for key, style, color, label in (
        ("sampled", "o-", "tab:red", "held-out accuracy, sampled T=1"),
        ("greedy", "s--", "tab:green", "held-out accuracy, greedy"),
    ):
        ax.plot(minutes, [e[key] for e in evals], style, color=color, label=label)
    ax.set_xlabel(f"minutes of training ({where})")
    ax.set_ylabel("accuracy / reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title("SmolLM2-135M-Instruct, two-digit arithmetic, GRPO through areal-proxy")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--snapshot-minutes", type=float, default=5)
    parser.add_argument("--config", default=str(REPO / "examples/arithmetic/config.toml"))
    parser.add_argument("--run-dir", default=str(REPO / "runs/learning_arithmetic"))
    parser.add_argument("--out", default=str(REPO / "examples/arithmetic"))
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="engine and trainer device (evaluations too)")
    parser.add_argument(
        "--lora",
        action="store_true",
        help=f"train LoRA adapters ([trainer.lora] {LORA}, lr {LORA_LR} unless --set trainer.optim.lr=...)",
    )
    parser.add_argument(
        "--skip-eval", action="store_true", help="no held-out evaluations: the run's steps and peak memory only"
    )
    parser.add_argument(
        "--final-samples",
        type=int,
        default=10,
        help="also score the last snapshot with this many sampled answers per problem (a steadier estimate)",
    )
    args = parser.parse_args()
    from proxy.runtime.model_files import DEFAULT_MODEL

    run_dir = Path(args.run_dir)
    evals_db = f"sqlite:///{run_dir.resolve()}/evals.db"  # the evaluation sessions, apart from the run's
    shutil.rmtree(run_dir, ignore_errors=True)
    snaps = run_dir / "snapshots"
    snaps.mkdir(parents=True)
    print("evaluating the untrained model ...", flush=True)
    evals = []
    if not args.skip_eval:
        evals.append({"minute": 0.0, "step": 0, **evaluate(DEFAULT_MODEL, evals_db, device=args.device)})
    if evals:
        print(json.dumps(evals[-1]), flush=True)

    cmd = [
        sys.executable,
        "-m",
        "proxy.cli",
        "train",
        args.config,
        "--set",
        f"trainer.run_dir={run_dir}",
        "--set",
        f"store.url=sqlite:///{run_dir}/areal.db",
        "--set",
        "trainer.checkpoint.every=5",
        "--set",
        "eval.every_minutes=0",  # the snapshots are evaluated here, after the run, not on its clock
        "--device",
        args.device,
    ]
    overrides = list(args.overrides)
    if args.lora:
        overrides.insert(0, f"trainer.lora={LORA}")
        if not any(o.startswith("trainer.optim.lr=") for o in overrides):
            overrides.insert(1, f"trainer.optim.lr={LORA_LR}")
    for o in overrides:
        cmd += ["--set", o]
    started = time.time()
    peak_gib = 0.0
    proc = start_process(cmd, run_dir / "train.out", cwd=REPO, env={"HF_HUB_OFFLINE": "1"})
    taken = []
    next_snap = args.snapshot_minutes
    while (elapsed := (time.time() - started) / 60) < args.minutes and proc.poll() is None:
        if elapsed >= next_snap:
            s = snapshot(run_dir, snaps, next_snap)
            if s:
                taken.append(s)
            next_snap += args.snapshot_minutes
        peak_gib = trainer_peak_rss(proc, peak_gib)
        time.sleep(5)
    peak_gib = trainer_peak_rss(proc, peak_gib)
    proc.send_signal(signal.SIGINT)
    proc.wait(600)
    final = snapshot(run_dir, snaps, round((time.time() - started) / 60, 1))
    if final:
        taken.append(final)
    for s in [] if args.skip_eval else taken:
        print(f"evaluating {s['path']} ...", flush=True)
        evals.append({"minute": s["minute"], "step": s["step"], **evaluate(s["path"], evals_db, device=args.device)})
        print(json.dumps(evals[-1]), flush=True)
    if taken and evals and args.final_samples > 1:
        repeated = evaluate(taken[-1]["path"], evals_db, samples=args.final_samples, device=args.device)
        evals[-1][f"sampled_mean_of_{args.final_samples}"] = repeated["sampled"]
        evals[-1][f"add_correct_mean_of_{args.final_samples}"] = repeated["sampled_add_correct"]
        evals[-1][f"sub_correct_mean_of_{args.final_samples}"] = repeated["sampled_sub_correct"]
        print(json.dumps(evals[-1]), flush=True)
    (run_dir / "evals.json").write_text(
        json.dumps(
            {"lora": args.lora, "overrides": overrides, "trainer_peak_rss_gib": peak_gib, "evals": evals}, indent=2
        )
    )
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    where = f"{os.cpu_count()} CPU cores" if args.device == "cpu" else args.device
    plot(metrics, evals, out / "curve.png", where)
    rows = [
        "| minutes | step | held-out sampled (T=1) | held-out greedy | + correct (sampled) | - correct (sampled) |",
        "|---|---|---|---|---|---|",
    ]
    for e in evals:
        rows.append(
            f"| {e['minute']:.1f} | {e['step']} | {e['sampled']:.1%} | {e['greedy']:.1%} | "
            f"{e['sampled_add_correct']:.0f} | {e['sampled_sub_correct']:.0f} |"
        )
    rows.append("")
    rows.append(f"trainer peak RSS: {peak_gib:.2f} GiB; settings: {' '.join(overrides) or 'the config as is'}")
    table = "\n".join(rows)
    (out / "results.md").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
