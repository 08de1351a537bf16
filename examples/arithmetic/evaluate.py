"""Held-out accuracy of a model on the arithmetic eval split (200 problems).

Asks each eval question exactly as the agent does (same chat rendering, same
max_tokens) through the embedded engine, sampled at temperature 1 and greedily,
and grades the reply with `math_exact`'s number extraction.

    python examples/arithmetic/evaluate.py                      # the base model
    python examples/arithmetic/evaluate.py --model runs/arithmetic/checkpoints/step_0000100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from proxy.config import EngineConfig  # noqa: E402
from proxy.engines.base import SamplingParams, generate  # noqa: E402
from proxy.engines.local import LocalEngine  # noqa: E402
from proxy.render import Renderer  # noqa: E402
from rewards.extract import extract_answer_number, numbers_equal  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent import MAX_TOKENS, messages_for, tasks  # noqa: E402


async def evaluate(model: str, samples: int = 1, seed: int = 0) -> dict[str, float]:
    engine = LocalEngine(EngineConfig(model=model, max_batch_size=256))
    await engine.start()
    renderer = Renderer(engine.tokenizer, engine.info.eos_token_ids)
    problems = tasks("eval")
    prompts = [renderer.prompt(messages_for(t), None, None).ids for t in problems]

    async def score(temperature: float, repeat: int) -> tuple[float, dict[str, float]]:
        jobs = []
        for r in range(repeat):
            for i, ids in enumerate(prompts):
                params = SamplingParams(max_new_tokens=MAX_TOKENS, temperature=temperature, seed=seed + 1000 * r + i)
                jobs.append(generate(engine, ids, params, request_id=f"{temperature}-{r}-{i}"))
        results = await asyncio.gather(*jobs)
        correct = {"+": 0, "-": 0}
        for k, res in enumerate(results):
            task = problems[k % len(problems)]
            text = engine.tokenizer.decode(res.output_ids, skip_special_tokens=True)
            if numbers_equal(extract_answer_number(text), task["reference"]):
                correct["+" if "+" in task["question"] else "-"] += 1
        total = sum(correct.values()) / len(results)
        return total, {op: n / repeat for op, n in correct.items()}

    sampled, sampled_ops = await score(1.0, samples)
    greedy, greedy_ops = await score(0.0, 1)
    await engine.stop()
    return {
        "sampled": sampled,
        "greedy": greedy,
        "sampled_add_correct": sampled_ops["+"],
        "sampled_sub_correct": sampled_ops["-"],
        "greedy_add_correct": greedy_ops["+"],
        "greedy_sub_correct": greedy_ops["-"],
        "problems": len(problems),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="model id, path or checkpoint directory")
    parser.add_argument("--samples", type=int, default=1, help="sampled answers per problem")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(evaluate(args.model, args.samples)), indent=2))


if __name__ == "__main__":
    main()
