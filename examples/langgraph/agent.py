"""A LangGraph calculator agent on LangChain's `ChatOpenAI`, trained on two-digit arithmetic.

The graph below is ordinary LangGraph code: an agent node that calls the model, a
`ToolNode` that runs the `calculate` tool, and `tools_condition` routing between them
until the model answers in text. The only thing that knows about training is the
`ChatOpenAI(base_url=..., api_key=...)` of this episode's proxy session. The small
default model calls tools reliably only when told which one, so the first call names
the tool in `tool_choice`; the next leaves it to the model, and the one after that
(`tool_choice="none"`) must answer, so an episode is at most three calls.
"""

from __future__ import annotations

import ast
import operator

from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
TOOL_CHOICE = ("calculate", "auto", "none")  # on the first call, the second, and the third (the last)
INSTRUCTIONS = "You are a calculator. Call the calculate tool with the expression, then reply: The answer is <result>."


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


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as `12 + 34` or `56 - 7`."""
    result = evaluate(expression)
    return str(int(result)) if float(result).is_integer() else str(result)


def calculator(llm: ChatOpenAI) -> CompiledStateGraph:
    """The agent graph around `llm`: model, then the tool while the model calls one, then the answer."""
    tools = [calculate]
    models = [llm.bind_tools(tools, tool_choice=choice) for choice in TOOL_CHOICE]

    async def agent(state: MessagesState) -> dict:
        model = models[sum(isinstance(m, AIMessage) for m in state["messages"])]
        return {"messages": [await model.ainvoke([SystemMessage(INSTRUCTIONS), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


async def run(task: dict, base_url: str, api_key: str) -> None:
    llm = ChatOpenAI(model="smollm2-135m-instruct", base_url=base_url, api_key=api_key, temperature=0.7, max_tokens=26)
    await calculator(llm).ainvoke({"messages": [("user", task["question"])]})
