"""What structured output costs the embedded engine on CPU: tokens/s of 50 completions with and
without a JSON schema, and the grammar's own cost per token.

The real model in-process (no HTTP), one prompt asking for a person as JSON, 50 completions at
T=1 sent at once (one decode batch), seeds 0..49, at most 128 new tokens each; the two runs
alternate `--rounds` times. Without a schema the model writes free text (of other lengths), so
tokens/s is the comparable figure; CPU seconds (of this process, all threads) are printed too,
as they hardly move when other processes share the cores. The grammar's share is measured
apart: every constrained reply is replayed through a fresh matcher, timing the mask
(`Matcher.allowed`) and the step (`Matcher.advance`) per token.

    .venv/bin/python benchmarks/structured_output.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy.engines.base import SamplingParams, generate  # noqa: E402
from proxy.engines.config import EngineConfig  # noqa: E402
from proxy.engines.grammar import Grammars, serialize  # noqa: E402
from proxy.engines.local import LocalEngine  # noqa: E402
from proxy.render import Renderer  # noqa: E402

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "hobbies"],
    "additionalProperties": False,
}
ASK = "Invent a person: their name, age, favourite colour and hobbies, as JSON."


async def run(
    engine: LocalEngine, prompt: list[int], schema: str | None, n: int
) -> tuple[float, float, list[list[int]]]:
    """Wall and CPU seconds of `n` completions at once, and their output ids."""
    jobs = [
        generate(
            engine,
            prompt,
            SamplingParams(max_new_tokens=128, temperature=1.0, seed=i, json_schema=schema),
            request_id=f"{'s' if schema else 'p'}{i}",
        )
        for i in range(n)
    ]
    start, cpu = time.perf_counter(), time.process_time()
    results = await asyncio.gather(*jobs)
    return time.perf_counter() - start, time.process_time() - cpu, [r.output_ids for r in results]


def grammar_cost(engine: LocalEngine, replies: list[list[int]], schema: str) -> tuple[float, float, int]:
    """Mean µs per token of the mask and of the step, replaying `replies` through fresh matchers."""
    grammars = Grammars(engine.tokenizer, engine._vocab, engine.info.eos_token_ids)
    mask_s = step_s = 0.0
    tokens = 0
    for reply in replies:
        matcher = grammars.matcher(schema)
        for token in reply:
            t0 = time.perf_counter()
            matcher.allowed()
            t1 = time.perf_counter()
            matcher.advance(token)
            step_s += time.perf_counter() - t1
            mask_s += t1 - t0
            tokens += 1
    return mask_s / tokens * 1e6, step_s / tokens * 1e6, tokens


async def main(args: argparse.Namespace) -> None:
    engine = LocalEngine(EngineConfig(threads=args.threads))
    await engine.start()
    try:
        renderer = Renderer(engine.tokenizer, engine.info.eos_token_ids)
        prompt = renderer.prompt([{"role": "user", "content": ASK}], None, None).ids
        schema = serialize(PERSON)
        await run(engine, prompt, schema, 2)  # warm up: the llguidance tokenizer, the compiled schema
        print("| run | schema | wall s | CPU s | tokens | tokens/s | tokens per CPU s | valid JSON |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        constrained: list[list[int]] = []
        for round_ in range(args.rounds):
            for with_schema in (False, True):
                wall, cpu, outs = await run(engine, prompt, schema if with_schema else None, args.n)
                tokens = sum(len(o) for o in outs)
                valid = sum(_valid(engine.tokenizer.decode(o, skip_special_tokens=True)) for o in outs)
                print(f"| {round_ + 1} | {'yes' if with_schema else 'no'} | {wall:.1f} | {cpu:.1f} | {tokens} "
                      f"| {tokens / wall:.1f} | {tokens / cpu:.1f} | {valid}/{len(outs)} |")  # fmt: skip
                if with_schema:
                    constrained = outs
        mask_us, step_us, tokens = grammar_cost(engine, constrained, schema)
        print(f"\ngrammar per token, replayed over {tokens} tokens: mask {mask_us:.1f} µs, step {step_us:.1f} µs")
    finally:
        await engine.stop()


def _valid(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="completions per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each kind, alternating")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    asyncio.run(main(parser.parse_args()))
