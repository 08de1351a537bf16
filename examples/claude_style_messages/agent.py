"""A tool-using agent written with the `anthropic` client (Messages API), trained on arithmetic.

A hand-written agent loop as in Anthropic's tool-use guide: ask with a
`calculate` tool, run every `tool_use` block, send the results back as
`tool_result` blocks, stop when the model answers in text. The client talks to
the proxy's `/v1/messages`; it appends `/v1/messages` to its base URL itself, so
the base URL is the session's without the trailing `/v1` (a command agent gets
exactly that in ANTHROPIC_BASE_URL). The first call names the tool in
`tool_choice`, since the small default model calls tools reliably only when told
which one; `math_exact` grades the final text.
"""

from __future__ import annotations

import ast
import operator
from typing import Any

import anthropic

MODEL = "smollm2-135m-instruct"
MAX_TURNS = 4
SYSTEM = "You are a calculator. Call the calculate tool with the expression, then reply: The answer is <result>."
CALCULATE = {
    "name": "calculate",
    "description": "Evaluate an arithmetic expression such as `12 + 34` or `56 - 7`.",
    "input_schema": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"{expression!r} is not an arithmetic expression")

    result = value(ast.parse(str(expression).strip().rstrip("?=").strip(), mode="eval").body)
    return str(int(result)) if float(result).is_integer() else str(result)


def tool_result(block: Any) -> dict[str, Any]:
    try:
        return {"type": "tool_result", "tool_use_id": block.id, "content": calculate(**block.input)}
    except (TypeError, ValueError, SyntaxError, ZeroDivisionError) as exc:
        return {"type": "tool_result", "tool_use_id": block.id, "content": str(exc), "is_error": True}


async def run(task: dict, base_url: str, api_key: str) -> None:
    client = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key=api_key, max_retries=2)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    tool_choice: dict[str, str] = {"type": "tool", "name": "calculate"}
    try:
        for _ in range(MAX_TURNS):
            reply = await client.messages.create(
                model=MODEL,
                system=SYSTEM,
                messages=messages,
                tools=[CALCULATE],
                tool_choice=tool_choice,
                max_tokens=32,
                extra_body={"temperature": 0.7},  # this client version takes sampling settings only here
            )
            if reply.stop_reason != "tool_use":
                return
            messages.append({"role": "assistant", "content": reply.content})
            messages.append(
                {"role": "user", "content": [tool_result(b) for b in reply.content if b.type == "tool_use"]}
            )
            tool_choice = {"type": "auto"}
    finally:
        await client.close()
