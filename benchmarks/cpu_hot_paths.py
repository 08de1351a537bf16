"""The CPU quickstart's three hottest paths outside the model's own decode, each timed alone.

- `sample`: drawing one token for each of 64 rows over the model's 49,152-token vocabulary at
  T = 1, every row seeded (the embedded engine does this once per decode step).
- `train_step`: one decoupled-PPO step on K prefix groups shaped like the arithmetic task's
  (a 102-token prompt whose first 89 tokens, the system prompt and worked examples, every
  prompt shares; 8 answers of 10 tokens each), bfloat16 autocast optional; K = 2 is a typical
  step of the example (most groups have no reward variance), K = 8 a full batch.
  `--no-shared-start` runs every prefix whole, as before the common start was run once.
  The model is loaded as the trainer and the engine load it on CPU: grouped-query eager attention and glibc's
  malloc told to keep freed memory; `--sdpa` and `--default-malloc` give the before of each.
- `decode`: one step of the embedded engine's decode batch, 64 left-padded rows over a
  100-token cache (its `BatchKV`), in bfloat16 with `--bf16` (as `engine.dtype = "bfloat16"`
  runs it), else float32.
- `push`: writing the weights the trainer pushes to the engine to /dev/shm, as float32 and as
  bfloat16.

Medians of several repeats after a warm-up, on the real model, with torch's default threads.
Run it on an otherwise idle machine:

    .venv/bin/python benchmarks/cpu_hot_paths.py [--bf16] [--no-shared-start] [--sdpa] [--default-malloc]
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import trainer.step  # noqa: E402
from proxy.engines.base import SamplingParams  # noqa: E402
from proxy.engines.kv import BatchKV  # noqa: E402
from proxy.engines.sampling import sample  # noqa: E402
from proxy.runtime.attention import register as grouped_attention  # noqa: E402
from proxy.runtime.devices import keep_freed_memory  # noqa: E402
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model  # noqa: E402
from trainer.batch import Sample, pack  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.step import train_step  # noqa: E402
from trainer.weights import write_weights  # noqa: E402


def median_seconds(fn, repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def arithmetic_groups(k: int) -> list:
    samples = []
    for g in range(k):
        prompt = [1] * 89 + [100 + g] * 13
        for i in range(8):
            answer = [200 + i] * 10
            samples.append(
                Sample(
                    input_ids=prompt + answer,
                    loss_mask=[0] * len(prompt) + [1] * len(answer),
                    behav_logprobs=[0.0] * len(prompt) + [-1.0] * len(answer),
                    versions=[-1] * len(prompt) + [0] * len(answer),
                    advantages=[0.0] * len(prompt) + [(-1.0) ** i] * len(answer),
                    temperature=1.0,
                )
            )
    return pack(samples, 4096, 0)


@torch.inference_mode()
def decode_step_ms(model, rows: int = 64, width: int = 100) -> float:
    from transformers.cache_utils import DynamicCache

    ids = torch.randint(100, 20_000, (rows, width), generator=torch.Generator().manual_seed(0))
    prefill = DynamicCache()
    model(input_ids=ids, cache=prefill, use_cache=True)
    kv = BatchKV()
    kv.add([[(layer.keys[i : i + 1], layer.values[i : i + 1]) for layer in prefill.layers] for i in range(rows)])
    token = torch.full((rows, 1), 1000)

    def step() -> None:
        mask, positions = kv.step_inputs()
        model(input_ids=token, attention_mask=mask, position_ids=positions, cache=kv.cache, use_cache=True)
        kv.commit_step(mask)

    return 1000 * median_seconds(step, 12, warmup=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bf16", action="store_true", help="train under bfloat16 autocast")
    parser.add_argument(
        "--no-shared-start", action="store_true", help="run each prefix whole, not their common start once"
    )
    parser.add_argument("--sdpa", action="store_true", help="torch's SDPA attention, not grouped eager")
    parser.add_argument("--default-malloc", action="store_true", help="leave glibc's malloc at its defaults")
    args = parser.parse_args()
    if args.no_shared_start:
        trainer.step.MIN_SHARED_PREFIX = 1 << 30
    from transformers import AutoModelForCausalLM

    malloc = "default" if args.default_malloc else "keep freed" if keep_freed_memory() else "default (not glibc)"
    attention = "sdpa" if args.sdpa else grouped_attention()
    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=attention)
    out: dict[str, float | int | str] = {"threads": torch.get_num_threads(), "attention": attention, "malloc": malloc}

    vocab = model.config.vocab_size
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(0)) * 3
    params = [SamplingParams(max_new_tokens=16, temperature=1.0, seed=i) for i in range(64)]
    gens = [torch.Generator().manual_seed(i) for i in range(64)]
    out["sample_64_rows_ms"] = round(1000 * median_seconds(lambda: sample(logits, params, gens), 20), 2)

    decode_model = copy.deepcopy(model).to(torch.bfloat16) if args.bf16 else model
    out["decode_64_rows_ms"] = round(decode_step_ms(decode_model.eval()), 1)
    del decode_model

    cfg = TrainerConfig(autocast_bf16=args.bf16, loss={"agg": "token_mean"})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-9, fused=True)
    for k in (2, 8):
        groups = arithmetic_groups(k)
        step = median_seconds(lambda g=groups: train_step(model, optimizer, g, cfg, torch.device("cpu"), 0), 3)
        out[f"train_step_{k}_groups_s"] = round(step, 3)

    root = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    try:
        for name, dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
            seconds = median_seconds(lambda d=dtype: write_weights(model, root / "v", d), 5)
            out[f"push_write_{name}_s"] = round(seconds, 3)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
