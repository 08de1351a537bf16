"""Simulated users of an arithmetic assistant, who rate every answer they get.

Each user asks a two-digit addition or subtraction (the arithmetic example's training problems) with
the plain `openai` client and one fixed API key, as any deployed assistant would; then, as a person
would click thumbs up or down, it posts feedback on the answer by the response id it got
(`POST /feedback`). No sessions, no runner: the proxy's online mode makes episodes of the traffic.

    python examples/online/users.py http://127.0.0.1:8000 --minutes 20 --users 32 --rate 1.0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from examples.arithmetic.agent import MAX_TOKENS, messages_for, tasks  # noqa: E402
from rewards.extract import extract_answer_number, numbers_equal  # noqa: E402


async def user(
    client: AsyncOpenAI,
    http: httpx.AsyncClient,
    problems: list[dict],
    rng: random.Random,
    rate: float,
    stop: float,
    stats: dict,
) -> None:
    while time.time() < stop:
        task = rng.choice(problems)
        try:
            reply = await client.chat.completions.create(
                model="assistant", messages=messages_for(task), max_tokens=MAX_TOKENS, temperature=1.0
            )
        except Exception as exc:  # noqa: BLE001 - a user sees an error: counted, and asks again
            stats["errors"] += 1
            stats.setdefault("last_error", repr(exc))
            await asyncio.sleep(1)
            continue
        stats["answers"] += 1
        text = reply.choices[0].message.content or ""
        correct = numbers_equal(extract_answer_number(text), task["reference"])
        stats["correct"] += correct
        minute = str(int((time.time() - stats["started"]) // 60))
        seen = stats["by_minute"].setdefault(minute, [0, 0])
        seen[0] += correct
        seen[1] += 1
        if rng.random() < rate:
            rating = {"response_id": reply.id, "thumbs": "up" if correct else "down"}
            try:
                r = await http.post("/feedback", json=rating)
            except httpx.HTTPError:  # the proxy went away (the run ended): counted
                stats["errors"] += 1
                continue
            stats["rated" if r.status_code == 200 else "rating_refused"] += 1


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the proxy's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--users", type=int, default=32, help="users asking at once")
    parser.add_argument("--rate", type=float, default=1.0, help="share of answers rated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key", default="sk-arithmetic-assistant", help="the assistant's one fixed key")
    args = parser.parse_args()
    problems = tasks("train", args.seed)
    rng = random.Random(args.seed)
    stats: dict = {"answers": 0, "correct": 0, "rated": 0, "rating_refused": 0, "errors": 0}
    stats.update(started=time.time(), by_minute={})
    stop = time.time() + 60 * args.minutes
    client = AsyncOpenAI(base_url=args.url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=2, timeout=600)
    async with httpx.AsyncClient(base_url=args.url.rstrip("/"), timeout=60) as http:
        seeds = [rng.randrange(2**31) for _ in range(args.users)]
        await asyncio.gather(*(user(client, http, problems, random.Random(s), args.rate, stop, stats) for s in seeds))
    stats["live_accuracy_by_minute"] = {m: round(c / n, 3) for m, (c, n) in stats.pop("by_minute").items()}
    stats.pop("started")
    print(json.dumps(stats))


if __name__ == "__main__":
    asyncio.run(main())
