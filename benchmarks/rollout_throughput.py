"""Episodes per second of the arithmetic quickstart's rollouts, with the engine's lean forward on and off.

Two measurements, each with `engine.fast_path = "auto"` (the lean forward: a step's decode rows and
prefills in one pass) and `"off"` (transformers' forward, prefills run apart):

- `engine`: the embedded engine in-process, fed the agent's prompts (4 samples per problem, as the
  screen runs them) by `--concurrency` requests at a time; the engine's own speed.
- `served`: `areal-proxy serve` as a process and the episode runner driving the example's agent
  (the `openai` client) through it with the example config's screening: what a training run's
  rollouts get, recording and rewards included, without the trainer.

    .venv/bin/python benchmarks/rollout_throughput.py [--dtype bfloat16] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples" / "arithmetic"))

import agent  # noqa: E402

from adapters.runner import EpisodeRunner  # noqa: E402
from adapters.tasks import load_tasks  # noqa: E402
from proxy.config import load_config  # noqa: E402
from proxy.engines.base import SamplingParams  # noqa: E402
from proxy.engines.config import EngineConfig  # noqa: E402
from proxy.engines.local import LocalEngine  # noqa: E402
from trainer.launch.processes import free_port, start_process, stop_process, wait_healthy  # noqa: E402


async def engine_rate(fast_path: str, dtype: str, concurrency: int, episodes: int) -> dict:
    engine = LocalEngine(EngineConfig(fast_path=fast_path, dtype=dtype))
    await engine.start()
    try:
        tasks = agent.tasks("train")
        prompts = []
        for task in tasks[: (episodes + 16) // 4 + 1]:
            ids = engine.tokenizer.apply_chat_template(agent.messages_for(task), add_generation_prompt=True)
            prompts += [ids if isinstance(ids, list) else ids["input_ids"]] * 4
        slots = asyncio.Semaphore(concurrency)
        params = SamplingParams(max_new_tokens=agent.MAX_TOKENS, temperature=1.0)

        async def one(i: int) -> None:
            async with slots:
                async for _ in engine.stream(prompts[i], params, request_id=str(i)):
                    pass

        await asyncio.gather(*(one(i) for i in range(16)))  # warm-up
        before = dict(engine.stats)
        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(16, 16 + episodes)))
        took = time.perf_counter() - started
        steps = engine.stats["steps"] - before["steps"]
        return {"episodes_per_s": round(episodes / took, 2), "ms_per_step": round(1000 * took / max(steps, 1), 1)}
    finally:
        await engine.stop()


async def _drive(runner: EpisodeRunner, seconds: float) -> dict:
    stop = asyncio.Event()
    run = asyncio.create_task(runner.run(stop))
    await asyncio.sleep(10)  # warm-up
    first, started = runner.stats.episodes_finished, time.time()
    await asyncio.sleep(seconds)
    done = runner.stats.episodes_finished - first
    stop.set()
    await asyncio.wait_for(run, 60)
    return {"episodes_per_s": round(done / (time.time() - started), 2)}


def served_rate(fast_path: str, dtype: str, seconds: float, concurrency: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(
            str(REPO / "examples/arithmetic/config.toml"),
            [
                f"engine.fast_path={fast_path}",
                f"engine.dtype={dtype}",
                f"store.url=sqlite:///{tmp}/areal.db",
                f"rollout.concurrency={concurrency}",
            ],
        )
        cfg.proxy.port = free_port()
        config = Path(tmp) / "config.json"
        config.write_text(json.dumps(cfg.model_dump(mode="json")))
        env = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
        log = Path(tmp) / "proxy.log"
        proxy = start_process(
            [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config)], log, cwd=REPO, env=env
        )
        try:
            url = f"http://127.0.0.1:{cfg.proxy.port}"
            wait_healthy(url, proxy, timeout=600, log_path=log)
            runner = EpisodeRunner(cfg.rollout, url, load_tasks(cfg.rollout.dataset, "train", 0))
            return asyncio.run(_drive(runner, seconds))
        finally:
            stop_process(proxy, 60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--seconds", type=float, default=60, help="measured time of each served run")
    parser.add_argument("--episodes", type=int, default=600, help="requests of each in-process run")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight in-process")
    parser.add_argument("--runner-concurrency", type=int, default=64, help="the runner's slots (rollout.concurrency)")
    args = parser.parse_args()
    results = {}
    for fast_path in ("off", "auto"):
        rate = asyncio.run(engine_rate(fast_path, args.dtype, args.concurrency, args.episodes))
        results[f"engine {fast_path}"] = rate
        print(json.dumps({f"engine {fast_path}": rate}), flush=True)
    for fast_path in ("off", "auto"):
        results[f"served {fast_path}"] = served_rate(fast_path, args.dtype, args.seconds, args.runner_concurrency)
        print(json.dumps({f"served {fast_path}": results[f"served {fast_path}"]}), flush=True)
    print(json.dumps({"dtype": args.dtype, "threads": os.cpu_count(), **results}, indent=2))


if __name__ == "__main__":
    main()
