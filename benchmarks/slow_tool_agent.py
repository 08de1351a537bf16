"""A tool-using agent whose tool takes real time: the workload of benchmarks/async_speedup.py.

Turn 1 calls `add` (forced by tool_choice, so the 135M model produces a valid call),
the tool "runs" for TOOL_SECONDS (a sleep standing in for a real environment step:
a web call, a code run), turn 2 answers with the tool's result in context.
"""

from __future__ import annotations

import asyncio
import json
import os

from openai import AsyncOpenAI

TOOL_SECONDS = float(os.environ.get("AREAL_TOOL_SECONDS", "3"))
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


async def run(task: dict, base_url: str, api_key: str) -> None:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=3)
    messages = [{"role": "user", "content": task["question"]}]
    try:
        first = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=[ADD],
            max_tokens=24,
            tool_choice={"type": "function", "function": {"name": "add"}},
        )
        message = first.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        await asyncio.sleep(TOOL_SECONDS)  # the tool's real latency
        for call in message.tool_calls or []:
            try:
                args = json.loads(call.function.arguments)
                result = str(int(args.get("a", 0)) + int(args.get("b", 0)))
            except (ValueError, TypeError):
                result = "error: bad arguments"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Please give the final number."})
        await client.chat.completions.create(model="policy", messages=messages, tools=[ADD], max_tokens=16)
    finally:
        await client.close()
