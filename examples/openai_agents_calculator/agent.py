"""A calculator agent written with the OpenAI Agents SDK, trained on two-digit arithmetic.

The Agent below is ordinary Agents SDK code: a `calculate` function tool and a
`Runner.run` loop, on the SDK's default Responses API. The only line that knows
about training is the `run_config`, which sends this episode's model calls to
its own proxy session. The small default model calls tools reliably only when
told which one, so the first call names the tool in `tool_choice` (the SDK
resets it to "auto" after that call); the second call reads the tool's result
and states the answer, which `math_exact` grades.
"""

from __future__ import annotations

import ast
import operator

from agents import Agent, ModelSettings, Runner, function_tool

from adapters.openai_agents import session_run_config

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate(expression: str) -> float:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"{expression!r} is not an arithmetic expression")

    return value(ast.parse(expression.strip().rstrip("?=").strip(), mode="eval").body)


@function_tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as `12 + 34` or `56 - 7`."""
    result = evaluate(expression)
    return str(int(result)) if float(result).is_integer() else str(result)


INSTRUCTIONS = "You are a calculator. Call the calculate tool with the expression, then reply: The answer is <result>."

calculator = Agent(
    name="calculator",
    instructions=INSTRUCTIONS,
    model="smollm2-135m-instruct",
    tools=[calculate],
    model_settings=ModelSettings(tool_choice="calculate", max_tokens=26, temperature=0.7),
)


async def run(task: dict, base_url: str, api_key: str) -> None:
    await Runner.run(calculator, task["question"], max_turns=4, run_config=session_run_config(base_url, api_key))
