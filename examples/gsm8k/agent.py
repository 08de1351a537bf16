"""GSM8K with the plain `openai` client: one question, a step-by-step answer ending in `#### N`.

`tasks(split, seed)` loads `openai/gsm8k` with the `datasets` package; point
`rollout.dataset` at a local JSONL file (`{"question", "answer"}` per line)
instead when there is no hub access. The reward is `math_exact` against the
number after `####` in the reference answer.
"""

from __future__ import annotations

import random

from openai import AsyncOpenAI

SYSTEM = "Solve the problem step by step. End your reply with a line '#### <number>' giving the final answer."


def tasks(split: str = "train", seed: int = 0) -> list[dict]:
    import datasets

    rows = datasets.load_dataset("openai/gsm8k", "main", split="train" if split == "train" else "test")
    out = [
        {"id": f"gsm8k-{split}-{i}", "question": r["question"], "reference": r["answer"]} for i, r in enumerate(rows)
    ]
    if split == "train":
        random.Random(seed).shuffle(out)
    return out


async def run(task: dict, base_url: str, api_key: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2)
    try:
        await client.chat.completions.create(
            model="policy",
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}],
            max_tokens=512,
            temperature=1.0,
        )
    finally:
        await client.close()
