"""No request can stop the embedded engine, and a fault of the engine itself fails every request
it holds at once (queued, running, taken for the next batch), then the engine restarts.

The engine runs in this process with the real model, so a fault can be injected exactly where a
real one would happen: inside a step, on the engine thread.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.engines import batch
from proxy.engines.base import EngineUnavailable, InvalidSampling, SamplingParams, generate
from proxy.engines.config import EngineConfig
from proxy.engines.local import LocalEngine

PROMPT = [1, 9690, 198, 2683, 314, 260]  # any ids in the vocabulary


@pytest.fixture(scope="module")
def engine():
    eng = LocalEngine(EngineConfig(max_batch_size=2, idle_release_s=0))

    async def start():
        await eng.start()

    asyncio.run(start())
    yield eng
    asyncio.run(eng.stop())


def run(coro):
    return asyncio.run(coro)


async def healthy(engine: LocalEngine, timeout: float = 30) -> dict:
    """The engine's health once it answers (it says 'restarting' while it recovers from a fault)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await engine.health()
        except EngineUnavailable as exc:
            assert "restarting" in str(exc)
            assert time.monotonic() < deadline, "the engine did not come back"
            await asyncio.sleep(0.05)


def params(**kw) -> SamplingParams:
    return SamplingParams(**{"max_new_tokens": 4, "temperature": 1.0, "seed": 1, **kw})


@pytest.mark.parametrize(
    "bad",
    [
        {"top_k": 2**63},  # overflowed a tensor inside the step and stopped the engine for good
        {"seed": 2**64},
        {"temperature": float("nan")},
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"max_new_tokens": 0},
        {"top_logprobs": 21},
        {"stop": ("x" * 5000,)},
        {"stop_token_ids": (-1,)},
    ],
)
def test_an_impossible_sampling_field_is_refused_before_the_batch(engine, bad):
    async def go():
        with pytest.raises(InvalidSampling):
            await generate(engine, PROMPT, params(**bad), request_id="bad")
        return await generate(engine, PROMPT, params(), request_id="good")

    assert len(run(go()).output_ids) == 4
    assert run(engine.health())["restarts"] == 0


def test_token_ids_outside_the_vocabulary_are_refused(engine):
    async def go():
        for ids in ([10**9], [-1], [1, 2, 3.5]):
            with pytest.raises(InvalidSampling):
                await generate(engine, ids, params(), request_id="bad-ids")

    run(go())


def test_a_request_whose_sampling_raises_fails_alone(engine, monkeypatch):
    real = batch.sample

    def sample(logits, ps, *rest):
        if any(p.top_k == 7 for p in ps):
            raise RuntimeError("this request's sampling breaks")
        return real(logits, ps, *rest)

    monkeypatch.setattr(batch, "sample", sample)

    async def go():
        bad = asyncio.create_task(generate(engine, PROMPT, params(top_k=7, max_new_tokens=8), request_id="bad"))
        good = asyncio.create_task(generate(engine, PROMPT, params(max_new_tokens=8), request_id="good"))
        outcome = await asyncio.gather(bad, good, return_exceptions=True)
        return outcome

    bad, good = run(go())
    assert isinstance(bad, Exception) and "sampling breaks" in str(bad)
    assert not isinstance(good, Exception) and len(good.output_ids) == 8
    assert run(engine.health())["restarts"] == 0


def test_a_step_fault_fails_every_held_request_promptly_and_the_engine_restarts(engine):
    real_step = engine._step

    async def go():
        calls = 0

        def faulty():
            nonlocal calls
            calls += 1
            if calls == 3:  # the first requests are running, others queued behind max_batch_size=2
                raise MemoryError("injected out of memory")
            real_step()

        engine._step = faulty
        try:
            jobs = [
                asyncio.create_task(generate(engine, PROMPT, params(max_new_tokens=64), request_id=f"r{i}"))
                for i in range(6)
            ]
            return await asyncio.wait_for(asyncio.gather(*jobs, return_exceptions=True), 60)
        finally:
            engine._step = real_step

    results = run(go())
    failed = [r for r in results if isinstance(r, EngineUnavailable)]
    assert len(failed) == 6, results  # running, queued and taken-for-the-batch alike
    assert all("injected out of memory" in str(r) for r in failed)
    health = run(healthy(engine))
    assert health["restarts"] == 1
    assert health["running"] == 0 and health["waiting"] == 0
    assert len(run(generate(engine, PROMPT, params(), request_id="after")).output_ids) == 4
