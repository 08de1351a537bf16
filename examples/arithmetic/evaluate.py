"""Held-out accuracy of a model on the arithmetic eval split (200 problems).

Asks each eval question exactly as the agent does (same chat rendering, same
max_tokens) through the embedded engine, sampled at temperature 1 and greedily,
and grades the reply with `math_exact`'s number extraction. With several sampled answers per
problem it also reports pass@k (the chance that at least one of k answers is right, by the
unbiased estimator of Chen et al. 2021, arXiv 2107.03374) and the accuracy per kind of problem:
how much a policy could still find by sampling, and where it fails.

    python examples/arithmetic/evaluate.py                      # the base model
    python examples/arithmetic/evaluate.py --model runs/arithmetic/checkpoints/step_0000100
    python examples/arithmetic/evaluate.py --samples 32         # pass@1..32 and per-kind accuracy
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from math import comb
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.engines.base import SamplingParams, generate  # noqa: E402
from proxy.engines.config import EngineConfig  # noqa: E402
from proxy.engines.local import LocalEngine  # noqa: E402
from proxy.render import Renderer  # noqa: E402
from proxy.sections import DEVICES  # noqa: E402
from rewards.extract import extract_answer_number, numbers_equal  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent import MAX_TOKENS, detailed_kind, messages_for, tasks  # noqa: E402


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k answers drawn without replacement from n, c of them right, is right)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


async def evaluate(model: str, samples: int = 1, seed: int = 0, device: str = "cpu", kind: str | None = None) -> dict:
    """Accuracies on the eval split, or on its problems of one `kind` ("addition", "subtraction")."""
    engine = LocalEngine(EngineConfig(model=model, max_batch_size=256, device=device))
    await engine.start()
    renderer = Renderer(engine.tokenizer, engine.info.eos_token_ids)
    problems = [t for t in tasks("eval") if kind is None or t["kind"] == kind]
    prompts = [renderer.prompt(messages_for(t), None, None).ids for t in problems]

    async def score(temperature: float, repeat: int) -> tuple[float, dict[str, float], list[int]]:
        jobs = []
        for r in range(repeat):
            for i, ids in enumerate(prompts):
                params = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=temperature, seed=seed + 1000 * r + i)
                jobs.append(generate(engine, ids, params, request_id=f"{temperature}-{r}-{i}"))
        results = await asyncio.gather(*jobs)
        correct = {"+": 0, "-": 0}
        per_problem = [0] * len(problems)
        for k, res in enumerate(results):
            task = problems[k % len(problems)]
            text = engine.tokenizer.decode(res.output_ids, skip_special_tokens=True)
            if numbers_equal(extract_answer_number(text), task["reference"]):
                correct["+" if "+" in task["question"] else "-"] += 1
                per_problem[k % len(problems)] += 1
        total = sum(correct.values()) / len(results)
        return total, {op: n / repeat for op, n in correct.items()}, per_problem

    sampled, sampled_ops, per_problem = await score(1.0, samples)
    greedy, greedy_ops, _ = await score(0.0, 1)
    await engine.stop()
    extra: dict = {}
    if samples > 1:
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k < samples] + [samples]
        extra["pass_at_k"] = {k: sum(pass_at_k(samples, c, k) for c in per_problem) / len(problems) for k in ks}
        by_kind: dict[str, list[int]] = {}
        for task, c in zip(problems, per_problem):
            by_kind.setdefault(detailed_kind(task["question"]), []).append(c)
        extra["sampled_by_kind"] = {
            kind: f"{sum(cs) / samples:.1f} of {len(cs)}" for kind, cs in sorted(by_kind.items())
        }
    return {
        "sampled": sampled,
        "greedy": greedy,
        "sampled_add_correct": sampled_ops["+"],
        "sampled_sub_correct": sampled_ops["-"],
        "greedy_add_correct": greedy_ops["+"],
        "greedy_sub_correct": greedy_ops["-"],
        "problems": len(problems),
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model id, path or checkpoint directory")
    parser.add_argument("--samples", type=int, default=1, help="sampled answers per problem")
    parser.add_argument("--device", choices=DEVICES, default="cpu")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(evaluate(args.model, args.samples, device=args.device)), indent=2))


if __name__ == "__main__":
    main()
