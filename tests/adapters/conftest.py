"""What every framework test here checks about a recorded episode, and the tokenizer to read it.

An episode is one session; its model calls must form one tree: a single root, each
other call's parent in the same session, and each child's token sequence starting
with its parent's exact prompt and sampled ids.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a (int): The first integer.
        b (int): The second integer.
    """
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a (int): The first integer.
        b (int): The second integer.
    """
    return a * b


def calculator(tool: str):
    """An ordinary Agents SDK agent with the two tools, greedy, its first call forced to `tool`."""
    from agents import Agent, ModelSettings, function_tool

    return Agent(
        name="calculator",
        instructions="You are a calculator. Use the add and multiply tools, then state the result.",
        model="smollm2-135m-instruct",
        tools=[function_tool(add), function_tool(multiply)],
        model_settings=ModelSettings(tool_choice=tool, max_tokens=26, temperature=0),
    )


def episode_nodes(proxy, session: dict) -> list[dict]:
    """The session's recorded calls, root first."""
    return sorted(proxy.session(session["session_id"])["completions"], key=lambda n: (n["depth"], n["created_at"]))


def assert_one_tree(nodes: list[dict]) -> None:
    by_id = {n["id"]: n for n in nodes}
    roots = [n for n in nodes if n["parent_id"] is None]
    assert len(roots) == 1, f"one tree per episode, got {len(roots)} roots"
    for node in nodes:
        assert node["output_ids"], "every call's sampled tokens are recorded"
        assert len(node["output_logprobs"]) == len(node["output_ids"])
        if node["parent_id"] is None:
            continue
        parent = by_id.get(node["parent_id"])
        assert parent is not None, "a call's parent is a call of the same episode"
        full = parent["prompt_ids"] + parent["output_ids"]
        assert (node["prompt_ids"] + node["output_ids"])[: len(full)] == full, "token-exact continuation"


def assert_chain(nodes: list[dict], length: int) -> None:
    """`length` calls, each the child of the one before."""
    shape = [(n["id"], n["parent_id"], n["finish_reason"]) for n in nodes]
    assert len(nodes) == length, f"expected {length} recorded calls, got {shape}"
    assert_one_tree(nodes)
    for parent, child in zip(nodes, nodes[1:]):
        assert child["parent_id"] == parent["id"]


@pytest.fixture(scope="session")
def tokenizer():
    """The served model's tokenizer, for reading what the model actually sampled."""
    from transformers import AutoTokenizer

    from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))


class _Recorder(BaseHTTPRequestHandler):
    received: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.received.append(self.path)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def trace_sink() -> Iterator[list[str]]:
    """The Agents SDK's tracing exporter pointed at a local recorder: whatever it would upload lands here."""
    from agents.tracing.processors import default_exporter

    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    exporter = default_exporter()
    original = exporter.endpoint
    exporter.endpoint = f"http://127.0.0.1:{server.server_port}/v1/traces/ingest"
    _Recorder.received = []
    try:
        yield _Recorder.received
    finally:
        exporter.endpoint = original
        server.shutdown()
