"""How the embedded engine should apply a pushed LoRA adapter on CPU: merged into the weights, or unmerged.

Merged: every push costs one s·B·A product per adapted weight (and the engine's repack of its fused
weights); decoding then costs what the base model costs. Unmerged: a push is free, but every decode
step runs two extra small matmuls per adapted layer. This measures both on the default model, in one
process, one after the other:

- `merge_s`: `proxy.runtime.adapters.merge` of a rank-R adapter on every linear layer, plus copying the
  result into the model (what `LocalEngine._merge_adapter` does), median of 5;
- decode tokens/s of the same Hugging Face model with the adapter merged and unmerged (peft's layers),
  greedy, `--batch` rows × `--new-tokens` tokens, median of `--repeats` interleaved runs;
- from them, after how many decoded tokens the unmerged overhead exceeds one merge.

    python benchmarks/lora_apply.py [--rank 16] [--batch 8] [--new-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def decode_rates(models: dict, batch: int, new_tokens: int, repeats: int) -> dict[str, float]:
    """Median decode tokens/s of each model, the models' runs interleaved so that a busy machine slows
    them alike."""
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253, 5356, 5646] for _ in range(batch)])
    mask = torch.ones_like(ids)
    rates: dict[str, list[float]] = {name: [] for name in models}
    with torch.no_grad():
        for model in models.values():  # warm-up
            model.generate(ids, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False)
        for _ in range(repeats):
            for name, model in models.items():
                t0 = time.perf_counter()
                model.generate(
                    ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
                )
                rates[name].append(batch * new_tokens / (time.perf_counter() - t0))
    return {name: statistics.median(r) for name, r in rates.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared machine)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved decode runs of each")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    import peft
    from transformers import AutoModelForCausalLM

    from proxy.runtime.adapters import load_adapter, merge
    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    torch.manual_seed(0)
    lora = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, target_modules=TARGETS),
    )
    for name, p in lora.named_parameters():
        if ".lora_B." in name:
            torch.nn.init.normal_(p, std=0.01)
    lora.eval()
    with tempfile.TemporaryDirectory() as tmp:
        lora.save_pretrained(Path(tmp) / "adapter")
        t0 = time.perf_counter()
        adapter = load_adapter(Path(tmp) / "adapter")
        read_s = time.perf_counter() - t0

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    params = base.state_dict()
    originals = {k: params[k].clone() for k in adapter.pairs}
    merges = []
    for _ in range(5):
        t0 = time.perf_counter()
        merged = merge(originals, adapter)
        with torch.no_grad():
            for key, value in merged.items():
                params[key].copy_(value)
        merges.append(time.perf_counter() - t0)
    merge_s = statistics.median(merges)

    rates = decode_rates({"merged": base, "unmerged": lora}, args.batch, args.new_tokens, args.repeats)
    merged_rate, unmerged_rate = rates["merged"], rates["unmerged"]
    per_token_overhead = 1 / unmerged_rate - 1 / merged_rate
    result = {
        "model": str(path),
        "rank": args.rank,
        "adapted_weights": len(adapter.pairs),
        "threads": torch.get_num_threads(),
        "adapter_read_s": round(read_s, 4),
        "merge_s": round(merge_s, 4),
        "decode_tok_s_merged": round(merged_rate, 1),
        "decode_tok_s_unmerged": round(unmerged_rate, 1),
        "unmerged_slowdown": round(merged_rate / unmerged_rate, 3),
        "tokens_until_unmerged_costs_one_merge": (
            round(merge_s / per_token_overhead) if per_token_overhead > 0 else None
        ),
    }
    print(json.dumps(result, indent=2))
    print(
        f"| rank | merge (s) | decode merged (tok/s) | decode unmerged (tok/s) | unmerged slowdown |\n"
        f"|---|---|---|---|---|\n"
        f"| {args.rank} | {merge_s:.3f} | {merged_rate:.1f} | {unmerged_rate:.1f} "
        f"| {merged_rate / unmerged_rate:.2f}x |"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
