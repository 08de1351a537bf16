"""Validation of `POST /v1/chat/completions` bodies into one typed request.

Loose where OpenAI clients are loose (unknown fields ignored, any model name,
`max_tokens` or `max_completion_tokens`), strict where a wrong value would
silently change what is sampled: every type and range error is a 400 naming the
offending parameter. Penalties, logit_bias and response_format are accepted and
not applied by the embedded engine (listed in `ignored`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from proxy.conversation import normalize_messages
from proxy.errors import invalid_request

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_IGNORED = ("presence_penalty", "frequency_penalty", "logit_bias", "response_format", "service_tier")


@dataclass
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    stream: bool = False
    include_usage: bool = True
    n: int = 1
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    ignored: list[str] = field(default_factory=list)

    @property
    def tool_names(self) -> set[str]:
        if self.tool_choice == "none":
            return set()
        return {t["function"]["name"] for t in self.tools}

    def forced_prefix(self) -> str:
        """Text the reply is made to start with, for `tool_choice` required or named."""
        if not self.tools or self.tool_choice in ("auto", "none"):
            return ""
        if isinstance(self.tool_choice, dict) or len(self.tools) == 1:
            chosen = self.tool_choice if isinstance(self.tool_choice, dict) else self.tools[0]
            name = chosen["function"]["name"]
            return '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": {'
        return '<tool_call>\n{"name": "'

    def sampling(self) -> dict[str, Any]:
        return {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "stop": self.stop,
            "n": self.n,
            "tool_choice": self.tool_choice,
        }


def _number(body: dict[str, Any], name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise invalid_request(f"{name} must be a number", name, "invalid_type")
    if not lo <= value <= hi:
        raise invalid_request(f"{name} must be between {lo} and {hi}, got {value}", name, "invalid_value")
    return float(value)


def _integer(body: dict[str, Any], name: str, lo: int, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request(f"{name} must be an integer", name, "invalid_type")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise invalid_request(f"{name} must be {bound}, got {value}", name, "invalid_value")
    return value


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid_request(f"{name} must be a boolean", name, "invalid_type")
    return value


def parse_tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise invalid_request("tools must be an array", "tools", "invalid_type")
    tools = []
    for i, tool in enumerate(raw):
        p = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise invalid_request(f"{p} must be a function tool", f"{p}.type")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not _TOOL_NAME.match(fn["name"]):
            raise invalid_request(
                f"{p}.function.name must match [A-Za-z0-9_.:-] and be at most 128 characters", f"{p}.function.name"
            )
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise invalid_request(f"{p}.function.parameters must be a JSON schema object", f"{p}.function.parameters")
        clean = {"name": fn["name"]}
        if isinstance(fn.get("description"), str):
            clean["description"] = fn["description"]
        if params is not None:
            clean["parameters"] = params
        tools.append({"type": "function", "function": clean})
    return tools


def parse_tool_choice(raw: Any, tools: list[dict[str, Any]]) -> str | dict[str, Any]:
    if raw is None:
        return "auto"
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise invalid_request("tool_choice 'required' needs tools", "tool_choice")
        return raw
    names = {t["function"]["name"] for t in tools}
    if isinstance(raw, dict) and isinstance(raw.get("function"), dict):
        name = raw["function"].get("name")
        if name not in names:
            raise invalid_request(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
        return {"type": "function", "function": {"name": name}}
    raise invalid_request("tool_choice must be 'auto', 'none', 'required' or a named function", "tool_choice")


def parse_stop(raw: Any) -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid_request("stop must be a non-empty string or an array of non-empty strings", "stop")
    if len(stops) > 16:
        raise invalid_request("stop accepts at most 16 sequences", "stop")
    return stops


def parse_chat_request(body: Any, max_n: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise invalid_request("the request body must be a JSON object")
    model = body.get("model", "")
    if not isinstance(model, str):
        raise invalid_request("model must be a string", "model", "invalid_type")
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid_request("stream_options must be an object", "stream_options")
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    tools = parse_tools(body.get("tools"))
    logprobs = _bool(body, "logprobs")
    top_logprobs = _integer(body, "top_logprobs", 0, 20) or 0
    if top_logprobs and not logprobs:
        raise invalid_request("top_logprobs needs logprobs: true", "top_logprobs")
    top_k = _integer(body, "top_k", -1)
    return ChatRequest(
        model=model,
        messages=normalize_messages(body.get("messages")),
        stream=stream,
        n=_integer(body, "n", 1, max_n) or 1,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=_top_p(body),
        top_k=max(0, top_k or 0),
        seed=_integer(body, "seed", -(2**63)),
        stop=parse_stop(body.get("stop")),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        tools=tools,
        tool_choice=parse_tool_choice(body.get("tool_choice"), tools),
        ignored=[k for k in _IGNORED if body.get(k) is not None],
    )


def _top_p(body: dict[str, Any]) -> float:
    value = _number(body, "top_p", 0.0, 1.0, 1.0)
    if value <= 0.0:
        raise invalid_request("top_p must be greater than 0", "top_p", "invalid_value")
    return value
