"""The embedded engine's prefix cache: prompts that begin alike reuse the cached keys/values of
their shared blocks, an agent's next turn reuses its previous reply's, answers come out exactly as
without the cache, and a weight update empties it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import torch

from proxy.engines.base import SamplingParams, generate
from proxy.engines.config import EngineConfig
from proxy.engines.local import LocalEngine
from proxy.engines.prefix_cache import BLOCK, PrefixCache
from proxy.render import Renderer

SYSTEM = (
    "You are a careful assistant for a small school. Answer every question with one short, plain "
    "sentence that a child can read, and say nothing else: no greeting, no list, no follow-up question."
)


def kv_of(prompt: list[int], layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake per-layer keys/values whose every position holds its token id (to check what is reused)."""
    t = torch.tensor(prompt, dtype=torch.float32).view(1, 1, -1, 1)
    return [(t.clone(), -t.clone()) for _ in range(layers)]


def test_trie_matches_whole_blocks_and_leaves_a_token():
    cache = PrefixCache(max_tokens=64)
    prompt = list(range(40))  # two full blocks and 8 tokens
    assert cache.match(prompt) == []
    cache.store(prompt, kv_of(prompt))
    assert len(cache) == 2
    chain = cache.match(prompt + [99])
    assert len(chain) == 2
    assert torch.equal(torch.cat([b.kv[0][0] for b in chain], 2).flatten(), torch.arange(32, dtype=torch.float32))
    # A prompt of exactly two blocks may reuse only the first: one token must be left to compute.
    assert len(cache.match(list(range(32)))) == 1
    # The same second block after a different first block is a different block.
    other = [7, *range(1, 40)]
    assert cache.match(other) == []


def test_least_recently_used_blocks_go_first_and_a_shared_start_stays():
    cache = PrefixCache(max_tokens=3 * BLOCK)
    shared = list(range(BLOCK))
    a = shared + [100 + i for i in range(BLOCK)] + [1]
    b = shared + [200 + i for i in range(BLOCK)] + [1]
    c = shared + [300 + i for i in range(BLOCK)] + [1]
    for p in (a, b, c):
        cache.store(p, kv_of(p))
    assert len(cache) == 3  # shared + two tails: the oldest tail (a's) went first
    assert len(cache.match(a)) == 1
    assert len(cache.match(b)) == 2
    assert len(cache.match(c)) == 2
    assert len(PrefixCache(max_tokens=0).match(a)) == 0


@contextlib.asynccontextmanager
async def cached_and_plain() -> AsyncIterator[tuple[LocalEngine, LocalEngine]]:
    """The default engine, and one without a prefix cache to compare its answers with."""
    cached = LocalEngine(EngineConfig())
    plain = LocalEngine(EngineConfig(prefix_cache_tokens=0))
    await cached.start()
    await plain.start()
    try:
        yield cached, plain
    finally:
        await cached.stop()
        await plain.stop()


def test_engine_reuses_a_shared_prefix_and_answers_as_without_it(perturbed_weights):
    async def main():
        async with cached_and_plain() as (cached, plain):
            renderer = Renderer(cached.tokenizer, cached.info.eos_token_ids)
            questions = ["What is 2 + 2?", "Name a colour.", "What is the capital of France?"]
            prompts = [
                renderer.prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], None, None).ids
                for q in questions
            ]
            greedy = SamplingParams(max_new_tokens=12, temperature=0.0)

            async def answers(engine: LocalEngine, tag: str) -> list:
                return [await generate(engine, p, greedy, request_id=f"{tag}{i}") for i, p in enumerate(prompts)]

            first = await answers(cached, "a")  # the first prompt fills the cache, the others reuse it
            stats = await cached.health()
            common = next(i for i, column in enumerate(zip(*prompts)) if len(set(column)) > 1)
            assert common >= 2 * BLOCK
            assert stats["cached_prompt_tokens"] == 2 * (common // BLOCK) * BLOCK  # prompts 2 and 3
            assert stats["prefill_tokens"] + stats["cached_prompt_tokens"] == sum(map(len, prompts))
            again = await answers(cached, "b")  # every full block of every prompt is cached now
            reference = await answers(plain, "c")
            assert (await plain.health())["cached_prompt_tokens"] == 0
            for x, y, ref in zip(first, again, reference):
                assert x.output_ids == y.output_ids == ref.output_ids
                assert max(abs(p - q) for p, q in zip(x.logprobs, ref.logprobs)) < 1e-3
                assert max(abs(p - q) for p, q in zip(y.logprobs, ref.logprobs)) < 1e-3

            await cached.update_weights(str(perturbed_weights), 1)
            assert (await cached.health())["prefix_cache_tokens"] == 0, "old weights' keys/values are gone"
            before = (await cached.health())["cached_prompt_tokens"]
            await plain.update_weights(str(perturbed_weights), 1)
            x = await generate(cached, prompts[0], greedy, request_id="d")
            ref = await generate(plain, prompts[0], greedy, request_id="e")
            assert (await cached.health())["cached_prompt_tokens"] == before  # computed afresh
            assert x.output_ids == ref.output_ids and set(x.versions) == {1}

    asyncio.run(main())


def test_next_turn_reuses_the_previous_reply_and_answers_as_without_it():
    """A session's next prompt is its previous prompt and reply plus new messages (the proxy keeps
    the exact tokens): only the new part and the last partial block are computed."""

    async def main():
        async with cached_and_plain() as (cached, plain):
            renderer = Renderer(cached.tokenizer, cached.info.eos_token_ids)
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me about rivers."}]
            ids = renderer.prompt(messages, None, None).ids
            reply = SamplingParams(max_new_tokens=40, temperature=0.0, ignore_eos=True)
            follow = cached.tokenizer.encode("<|im_start|>user\nAnd about lakes?<|im_end|>\n<|im_start|>assistant\n")
            for turn in range(3):
                before = (await cached.health())["prefill_tokens"]
                x = await generate(cached, ids, reply, request_id=f"a{turn}")
                computed = (await cached.health())["prefill_tokens"] - before
                ref = await generate(plain, ids, reply, request_id=f"b{turn}")
                assert x.output_ids == ref.output_ids
                assert max(abs(p - q) for p, q in zip(x.logprobs, ref.logprobs)) < 1e-3
                if turn:
                    # new: the last reply's final token and the follow-up; at most a block's worth before it
                    assert len(follow) + 1 <= computed < len(follow) + 1 + BLOCK, (turn, computed)
                ids = ids + x.output_ids + follow

    asyncio.run(main())
