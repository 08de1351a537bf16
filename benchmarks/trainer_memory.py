"""Peak memory and step time of one trainer step per memory setting, on CPU.

Each setting runs in a fresh process (so one's peak cannot hide another's) over a fixed synthetic
GRPO batch: `--rows` replies of `--reply` tokens sharing a `--prefix`-token prompt, advantages ±1,
packed with `trainer.batch.pack` and trained with `trainer.step.train_step`, 1 warm-up step then
`--steps` timed ones. Reported per setting:

- `peak_gib`: the process's peak RSS (`ru_maxrss`); `load_gib`: RSS once the model and optimizer are
  built; `step_gib` = peak − load: what training adds (gradients, optimizer state, activations);
- `estimate_gib`: `trainer.memory` for the same thing (`static_bytes` + `pass_bytes` of the pass);
- `step_s`: median seconds of the timed steps.

Settings: float32 (logprobs through full (N, V) logits, `trainer.head.plain_logprobs`); bfloat16
weights with float32 masters; + gradient checkpointing; + chunked logprobs (`head_logprobs`, the
trainer's default); + 8-bit AdamW (torchao); LoRA rank 16. The default model loads from the model
cache; `1b` is a randomly initialised Llama of ~1B parameters built from a config (no download).

    python benchmarks/trainer_memory.py [--models default,1b] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SETTINGS = {  # name -> (dtype, checkpointing, chunked logprobs, optimizer, lora, processes)
    "float32": ("float32", False, False, "adamw", False, 1),
    "float32 + chunked": ("float32", False, True, "adamw", False, 1),
    "bfloat16": ("bfloat16", False, False, "adamw", False, 1),
    "bfloat16 + checkpointing": ("bfloat16", True, False, "adamw", False, 1),
    "bfloat16 + checkpointing + chunked": ("bfloat16", True, True, "adamw", False, 1),
    "bfloat16 + checkpointing + chunked + 8-bit AdamW": ("bfloat16", True, True, "adamw_8bit", False, 1),
    "LoRA r16, bfloat16 + checkpointing + chunked": ("bfloat16", True, True, "adamw", True, 1),
    "FSDP2 x 2 processes, float32 + chunked": ("float32", False, True, "adamw", False, 2),
}
# The ~1B model's full fine-tunes need 16 GiB (float32 weights, gradients and AdamW state; bfloat16 with
# masters the same) beside the rest of a shared 24 GiB machine, and bfloat16 compute on a CPU without
# AVX-512 BF16 is ~30x slower than float32: on such a machine its rows are float32 LoRA.
SETTINGS["LoRA r16, float32 + chunked"] = ("float32", False, True, "adamw", True, 1)
SETTINGS["LoRA r16, float32 + checkpointing + chunked"] = ("float32", True, True, "adamw", True, 1)
ROWS = {
    "default": [name for name in SETTINGS if "LoRA r16, float32" not in name],
    "1b": ["LoRA r16, float32 + chunked", "LoRA r16, float32 + checkpointing + chunked"],
}
BATCHES = {"default": (2, 2, 32, 32), "1b": (1, 2, 32, 32)}  # prompts, replies to each, prefix, reply tokens
ONE_B = {  # a Llama of 1.0B parameters, the default model's vocabulary
    "vocab_size": 49152,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 20,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
    "max_position_embeddings": 2048,
}


def rss_gib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 30)


def batch(prompts: int, rows: int, prefix: int, reply: int) -> list:
    """`prompts` random prompts of `prefix` tokens, `rows` random replies of `reply` tokens to each."""
    import torch

    from trainer.batch import Sample

    g = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(prompts):
        prompt = torch.randint(100, 40000, (prefix,), generator=g).tolist()
        for r in range(rows):
            ids = prompt + torch.randint(100, 40000, (reply,), generator=g).tolist()
            mask = [0] * prefix + [1] * reply
            adv = 1.0 if r % 2 else -1.0
            samples.append(Sample(ids, mask, [-2.0 * m for m in mask], [0] * len(ids), [adv * m for m in mask], 1.0))
    return samples


def load_model(model_name: str, setting: str) -> Any:
    """The model the way `trainer.policy.build` makes it (LoRA adapters, checkpointing)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
    from trainer.config import LoraConfig
    from trainer.policy import _with_adapters

    dtype_name, checkpointing, _, _, lora, _ = SETTINGS[setting]
    dtype = getattr(torch, dtype_name)
    if model_name == "default":
        path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(LlamaConfig(**ONE_B), dtype=dtype)
    if lora:
        model = _with_adapters(model, LoraConfig(rank=16), None).get_base_model()
    if checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def timed(step: Callable[[], Any], steps: int) -> float:
    """Median seconds of `steps` calls of `step` after one warm-up call."""
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        step()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def one(model_name: str, setting: str, steps: int, sizes: tuple[int, ...]) -> dict:
    """One setting, in this process: what `main` runs in a fresh one per setting."""
    import torch

    import trainer.step
    from trainer.batch import pack
    from trainer.config import TrainerConfig
    from trainer.head import plain_logprobs
    from trainer.memory import GIB, ModelShape, pass_bytes, static_bytes
    from trainer.optim import build_optimizer

    dtype_name, checkpointing, chunked, optim, _, processes = SETTINGS[setting]
    if processes > 1:
        return spawned(model_name, setting, steps, sizes, processes)
    torch.set_num_threads(os.cpu_count() or 1)
    if not chunked:
        trainer.step.head_logprobs = plain_logprobs
    cfg = TrainerConfig(loss={"agg": "token_mean"}, optim={"name": optim, "lr": 1e-6, "grad_clip": 1.0})
    model = load_model(model_name, setting)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(trainable, cfg.optim, torch.device("cpu"))
    load_gib = rss_gib()
    groups = pack(batch(*sizes), cfg.batch.tokens_per_microbatch, pad_id=0)
    step_s = timed(lambda: trainer.step.train_step(model, optimizer, groups, cfg, torch.device("cpu"), 0), steps)
    shape = ModelShape.of(model.config, bf16=dtype_name == "bfloat16")
    estimate = static_bytes(model, optim) + pass_bytes(shape, groups, checkpointing)
    return report(model, model_name, setting, groups, load_gib, estimate / GIB, step_s)


def report(
    model: Any, model_name: str, setting: str, groups: list, load_gib: float, estimate_gib: float, step_s: float
) -> dict:
    """One table row: this process's peak RSS beside its RSS after loading, the estimate, the step time."""
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)
    return {
        "model": model_name,
        "setting": setting,
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6),
        "tokens": sum(len(g.prefix) + g.continuation.numel() for g in groups),
        "peak_gib": round(peak_gib, 2),
        "load_gib": round(load_gib, 2),
        "step_gib": round(peak_gib - load_gib, 2),
        "estimate_gib": round(estimate_gib, 2),
        "step_s": round(step_s, 2),
    }


def spawned(model_name: str, setting: str, steps: int, sizes: tuple[int, ...], world: int) -> dict:
    """An FSDP2 setting: `world` processes (`trainer.distributed`), each measured as one setting is;
    the row is rank 0's, its peak the largest rank's."""
    import tempfile

    import torch.multiprocessing as mp

    from trainer.launch.processes import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_rank_main, args=(world, free_port(), model_name, setting, steps, sizes, out), nprocs=world)
        ranks = [json.loads(Path(out, f"{r}.json").read_text()) for r in range(world)]
    row = dict(ranks[0])
    row["peak_gib"] = max(r["peak_gib"] for r in ranks)
    row["step_gib"] = max(r["step_gib"] for r in ranks)
    return row


def _rank_main(
    rank: int, world: int, port: int, model_name: str, setting: str, steps: int, sizes: tuple[int, ...], out: str
) -> None:
    """One FSDP2 rank: the model sharded (`distributed.Sharded`), the optimizer over its shards, this
    rank's share of the batch (`distributed.train_step_sharded`). The ranks share the machine's cores."""
    import torch

    from trainer import distributed
    from trainer.batch import pack
    from trainer.config import TrainerConfig
    from trainer.memory import GIB, ModelShape, pass_bytes
    from trainer.optim import build_optimizer

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    cpu = torch.device("cpu")
    me = distributed.Rank(rank, world, rank)
    distributed.init(me, cpu, timeout_s=1800)
    try:
        dtype_name, checkpointing, _, optim, _, _ = SETTINGS[setting]
        cfg = TrainerConfig(loss={"agg": "token_mean"}, optim={"name": optim, "lr": 1e-6, "grad_clip": 1.0})
        model = load_model(model_name, setting)
        n = sum(p.numel() for p in model.parameters())
        sharded = distributed.Sharded(model)
        inner = build_optimizer(list(model.parameters()), cfg.optim, cpu)
        optimizer = distributed.ShardedOptimizer(inner, sharded, cfg.optim.grad_clip)
        load_gib = rss_gib()
        groups = pack(batch(*sizes), cfg.batch.tokens_per_microbatch, pad_id=0)
        [mine] = distributed.shares([groups], me)
        step_s = timed(lambda: distributed.train_step_sharded(optimizer, groups, mine, cfg, cpu, 0), steps)
        # Gathered weights and unsharded gradients during the passes, this rank's half of AdamW's state.
        shape = ModelShape.of(model.config, bf16=dtype_name == "bfloat16")
        estimate = n * 4 + n * 8 / world + pass_bytes(shape, mine, checkpointing)
        row = report(model, model_name, setting, groups, load_gib, estimate / GIB, step_s)
        row["params_m"] = round(n / 1e6)
        Path(out, f"{rank}.json").write_text(json.dumps(row))
    finally:
        distributed.close()


def table(results: list[dict]) -> str:
    lines = [
        "| model | setting | peak RSS GiB | after load GiB | step adds GiB | estimate GiB | step s |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['setting']} | {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['model']} ({r['params_m']}M) | {r['setting']} | {r['peak_gib']} | {r['load_gib']} | "
            f"{r['step_gib']} | {r['estimate_gib']} | {r['step_s']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="default,1b")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--only", help="run only the settings whose name contains this")
    parser.add_argument("--batch", help="PROMPTS,REPLIES,PREFIX,REPLY tokens for every model (default: BATCHES)")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "SETTING"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        sizes = tuple(int(x) for x in args.batch.split(","))
        print(json.dumps(one(*args.one, args.steps, sizes)))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    results = []
    for model_name in args.models.split(","):
        sizes = args.batch or ",".join(map(str, BATCHES[model_name]))
        for setting in ROWS[model_name]:
            if args.only and args.only not in setting:
                continue
            cmd = [sys.executable, __file__, "--one", model_name, setting, "--steps", str(args.steps), "--batch", sizes]
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            if done.returncode:
                tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
                results.append({"model": model_name, "setting": setting, "error": tail[0][:120]})
            else:
                results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), flush=True)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
