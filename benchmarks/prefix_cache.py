"""What the embedded engine's prefix cache saves, on two workloads, with the cache on and off.

- `arithmetic`: the CPU quickstart's calls — 32 problems × 8 samples, each prompt the two worked
  examples then the question (the example's own `messages_for`), 16 new tokens at T=1, all sent
  at once (the episode runner keeps this many in flight).
- `multiturn`: 16 conversations of 6 turns each, every turn resending the whole history (what
  an agent does): a long system prompt, then the model's own earlier replies and a new user
  message each turn; 24 new tokens per turn, the 16 conversations concurrent.

For each, the wall time, the prompt tokens prefilled and the prompt tokens taken from the cache,
on the real model in-process (no HTTP), with the engine's default threads.

    .venv/bin/python benchmarks/prefix_cache.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "arithmetic"))

from agent import messages_for, tasks  # noqa: E402

from proxy.engines.base import SamplingParams, generate  # noqa: E402
from proxy.engines.config import EngineConfig  # noqa: E402
from proxy.engines.local import LocalEngine  # noqa: E402
from proxy.render import Renderer  # noqa: E402

SYSTEM = (
    "You are a research assistant working inside a tool-using agent. Think about the user's request, "
    "say what you would look up, and keep every answer under three sentences. Cite nothing you did not "
    "read. When a question is ambiguous, state the reading you chose. Never invent numbers."
)


async def arithmetic(engine: LocalEngine, renderer: Renderer, offset: int) -> None:
    problems = tasks("train")[offset : offset + 32]
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    jobs = []
    for i, task in enumerate(problems):
        ids = renderer.prompt(messages_for(task), None, None).ids
        jobs += [generate(engine, ids, params, request_id=f"a{offset + i}-{j}") for j in range(8)]
    await asyncio.gather(*jobs)


async def multiturn(engine: LocalEngine, renderer: Renderer, offset: int) -> None:
    params = SamplingParams(max_new_tokens=24, temperature=1.0)

    async def conversation(c: int) -> None:
        messages = [{"role": "system", "content": SYSTEM}]
        for turn in range(6):
            messages.append({"role": "user", "content": f"Conversation {c}, question {turn}: what should I read next?"})
            ids = renderer.prompt(messages, None, None).ids
            out = await generate(engine, ids, params, request_id=f"m{c}-{turn}")
            messages.append({"role": "assistant", "content": engine.tokenizer.decode(out.output_ids)})

    await asyncio.gather(*(conversation(offset + c) for c in range(16)))


async def measure(workload: str, cache_tokens: int) -> dict:
    engine = LocalEngine(EngineConfig(prefix_cache_tokens=cache_tokens))
    await engine.start()
    renderer = Renderer(engine.tokenizer, engine.info.eos_token_ids)
    run = arithmetic if workload == "arithmetic" else multiturn
    await run(engine, renderer, 100)  # warm-up on other prompts (first-call costs); not counted
    before = dict(await engine.health())
    started = time.perf_counter()
    await run(engine, renderer, 0)
    seconds = time.perf_counter() - started
    after = await engine.health()
    await engine.stop()
    return {
        "seconds": seconds,
        "prefilled": after["prefill_tokens"] - before["prefill_tokens"],
        "cached": after["cached_prompt_tokens"] - before["cached_prompt_tokens"],
        "generated": after["tokens"] - before["tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["arithmetic", "multiturn"])
    args = parser.parse_args()
    print("| workload | prefix cache | wall s | prompt tokens prefilled | from the cache | tokens generated |")
    print("|---|---|---|---|---|---|")
    for workload in args.workloads:
        for cache_tokens in (0, 8192):
            r = asyncio.run(measure(workload, cache_tokens))
            label = "off" if cache_tokens == 0 else f"{cache_tokens} tokens"
            print(
                f"| {workload} | {label} | {r['seconds']:.1f} | {r['prefilled']:,} | {r['cached']:,} "
                f"| {r['generated']:,} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
