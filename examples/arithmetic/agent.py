"""The CPU quickstart agent: two-digit addition and subtraction with the plain `openai` client.

`tasks(split, seed)` generates the problems on the fly (no data file): every
a ∘ b with a, b in 10..99 and ∘ in {+, -}; a fixed, seeded set of 200 is held
out as the eval split and never appears in train. Each task carries its `kind`
(addition, subtraction) and its `form` (with or without a carry or borrow, or a
negative answer), fields `rollout.balance_by` can draw by. `run(task, base_url, api_key)`
is the agent: one question, one answer, exactly as a user would write it.
"""

from __future__ import annotations

import asyncio
import random
import weakref

from openai import AsyncOpenAI, DefaultAsyncHttpxClient

EVAL_SIZE = 200
MAX_TOKENS = 16
# Two worked examples as earlier turns show the answer format ("a op b = c"); without them the
# 135M model rambles past the answer (1% sampled accuracy here; 9% with them).
EXAMPLES = [
    {"role": "user", "content": "What is 23 + 45?"},
    {"role": "assistant", "content": "23 + 45 = 68"},
    {"role": "user", "content": "What is 81 - 36?"},
    {"role": "assistant", "content": "81 - 36 = 45"},
]


def _all_problems() -> list[tuple[int, str, int]]:
    return [(a, op, b) for a in range(10, 100) for b in range(10, 100) for op in ("+", "-")]


def _form(x: int, op: str, y: int) -> str:
    if op == "+":
        return "addition, carry" if x % 10 + y % 10 >= 10 else "addition, no carry"
    if x < y:
        return "subtraction, negative"
    return "subtraction, borrow" if x % 10 < y % 10 else "subtraction, no borrow"


def detailed_kind(question: str) -> str:
    """'What is 47 - 85?' -> 'subtraction, negative': additions with or without a carry into the
    tens, subtractions without or with a borrow, or with a negative answer."""
    a, op, b = question.removeprefix("What is ").removesuffix("?").split()
    return _form(int(a), op, int(b))


def tasks(split: str = "train", seed: int = 0) -> list[dict]:
    problems = _all_problems()
    rng = random.Random(1234)  # the eval split is the same whatever the training seed
    held_out = set(rng.sample(range(len(problems)), EVAL_SIZE))
    chosen = sorted(held_out) if split == "eval" else [i for i in range(len(problems)) if i not in held_out]
    out = []
    for i in chosen:
        a, op, b = problems[i]
        answer = a + b if op == "+" else a - b
        kind = "addition" if op == "+" else "subtraction"
        out.append(
            {
                "id": f"{a}{op}{b}",
                "question": f"What is {a} {op} {b}?",
                "reference": str(answer),
                "kind": kind,
                "form": _form(a, op, b),
            }
        )
    if split != "eval":
        random.Random(seed).shuffle(out)
    return out


def messages_for(task: dict) -> list[dict]:
    return [*EXAMPLES, {"role": "user", "content": task["question"]}]


# One HTTP connection pool per event loop, shared by every episode: each new `AsyncOpenAI()`
# builds its own pool and SSL context (~20 ms of CPU), which with 64 short episodes at a time
# took ~60% of the episode runner's CPU, on a machine whose 2 cores also sample and train.
_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pool() -> DefaultAsyncHttpxClient:
    loop = asyncio.get_running_loop()
    if loop not in _POOLS:
        _POOLS[loop] = DefaultAsyncHttpxClient()
    return _POOLS[loop]


async def run(task: dict, base_url: str, api_key: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2, http_client=_pool())
    await client.chat.completions.create(
        model="smollm2", messages=messages_for(task), max_tokens=MAX_TOKENS, temperature=1.0
    )


def addition_tasks(split: str = "train", seed: int = 0) -> list[dict]:
    """Only the additions: the quick-learning subset the CI learning test trains on."""
    return [t for t in tasks(split, seed) if "+" in t["question"]]
