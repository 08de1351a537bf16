"""Train an example for a fixed number of steps and write its reward curve (PNG) and a table.

Runs `areal-proxy train <example>/config.toml` with a fresh store and run directory under
`runs/curves/<name>`, then plots the training reward (mean over each step's sessions,
sampled as the config says) per step and writes `curve.png` and `results.md` next to the
example's config.

    python benchmarks/train_curve.py examples/openai_agents_calculator --steps 12
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def plot(name: str, steps: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = steps[0]["time"] - steps[0].get("wait_s", 0) - steps[0].get("train_s", 0)
    xs = [s["step"] for s in steps]
    window = 3
    rewards = [s["reward_mean"] for s in steps]
    smooth = [
        sum(rewards[max(0, i - window + 1) : i + 1]) / len(rewards[max(0, i - window + 1) : i + 1])
        for i in range(len(rewards))
    ]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, rewards, "o", color="tab:blue", alpha=0.4, label="reward per step")
    ax.plot(xs, smooth, "-", color="tab:blue", label=f"{window}-step mean")
    ax.set_xlabel(f"trainer step ({(steps[-1]['time'] - t0) / 60:.0f} minutes on 2 CPU cores in all)")
    ax.set_ylabel("mean episode reward")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    ax.set_title(f"{name}: SmolLM2-135M-Instruct, GRPO through areal-proxy", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", help="an example folder holding config.toml")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    example = Path(args.example).resolve()
    name = example.name
    run_dir = REPO / "runs" / "curves" / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, "-m", "proxy.cli", "train", str(example / "config.toml")]
    sets = [
        f"trainer.max_steps={args.steps}",
        f"trainer.run_dir={run_dir}",
        f"store.url=sqlite:///{run_dir}/areal.db",
        "trainer.checkpoint.every=1000",
        *args.overrides,
    ]
    for s in sets:
        cmd += ["--set", s]
    started = time.time()
    with open(run_dir / "train.out", "w") as log:
        code = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}
        ).returncode
    minutes = (time.time() - started) / 60
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steps = [m for m in metrics if "reward_mean" in m]
    if code != 0 or not steps:
        sys.exit(f"training exited {code} after {minutes:.1f} min with {len(steps)} steps; see {run_dir}/train.out")
    plot(name, steps, example / "curve.png")
    rows = [
        f"`areal-proxy train examples/{name}/config.toml --set trainer.max_steps={args.steps}`"
        + "".join(f" `--set {o}`" for o in args.overrides)
        + f": {minutes:.1f} minutes wall clock on 2 CPU cores, including the model load.",
        "",
        "| step | sessions | mean reward | share rewarded | staleness | skipped (no variance) | train s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in steps:
        rows.append(
            f"| {s['step']} | {s['sessions']} | {s['reward_mean']:.2f} | {s['accuracy']:.0%} | "
            f"{s['staleness_mean']:.2f} | {s['skipped_zero_variance']} | {s['train_s']:.1f} |"
        )
    (example / "results.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
