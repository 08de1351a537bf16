"""A training run's checkpoint write, with its optimizer state through the page cache or past it.

`trainer.checkpoint.save` of the default model (float32) and its AdamW state after one step: the
model by `save_pretrained`, the optimizer state by `trainer.uncached.save` (O_DIRECT through one
reused buffer) in one arm and by `torch.save` in the other; the checkpoint fsyncs both before its
rename. The arms alternate, ABBA, with `--gap` seconds between saves (a training step's worth: pages
a run freed a while ago are what a new file gets). Reported per save: wall seconds and the process's
system CPU seconds; then medians.

    python benchmarks/checkpoint_write.py [--rounds 4] [--gap 10] [--dir /tmp/checkpoint_write]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="saves per arm")
    parser.add_argument("--gap", type=float, default=10.0, help="seconds between saves")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/checkpoint_write"), help="the run directory")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
    from trainer import checkpoint, uncached

    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()  # the moments exist: 8 bytes a parameter

    arms = {"page cache": torch.save, "O_DIRECT": uncached.save}
    direct_save = uncached.save
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    shutil.rmtree(args.dir, ignore_errors=True)
    step = 0
    try:
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for name in order:
                uncached.save = arms[name]
                step += 1
                before = resource.getrusage(resource.RUSAGE_SELF)
                started = time.perf_counter()
                checkpoint.save(args.dir, model, optimizer, checkpoint.TrainerState(step=step))
                wall = time.perf_counter() - started
                system = resource.getrusage(resource.RUSAGE_SELF).ru_stime - before.ru_stime
                results[name].append((wall, system))
                print(f"{name:>10}: {wall:.2f} s (system CPU {system:.2f} s)", flush=True)
                time.sleep(args.gap)
    finally:
        uncached.save = direct_save
        shutil.rmtree(args.dir, ignore_errors=True)
    print("\n| optimizer state written | median s | median system CPU s | saves (s) |\n|---|---:|---:|---|")
    for name, runs in results.items():
        walls = [w for w, _ in runs]
        systems = [s for _, s in runs]
        listed = ", ".join(f"{w:.2f}" for w in walls)
        print(f"| {name} | {statistics.median(walls):.2f} | {statistics.median(systems):.2f} | {listed} |")


if __name__ == "__main__":
    main()
