"""Llama 3.1-3.3 JSON calls: the reply is the call, optionally after `<|python_tag|>`.

    {"name": "get_weather", "parameters": {"city": "Paris"}}

Several calls are separated by `;`. A reply that starts with `{` but names no offered tool
is the model's plain JSON answer and stays content.
"""

from __future__ import annotations

import json

from proxy.parsers.base import BAD, MORE, Step, ToolFormat, json_object_at, named_call, one_object_grammar, tool_format

PYTHON_TAG = "<|python_tag|>"


@tool_format("llama3_json", "llama3", "llama4_json")
class Llama3Json(ToolFormat):
    leading_markers = (PYTHON_TAG, "{")
    special_tokens = True  # <|python_tag|> is a special token in Llama's vocabulary

    def __init__(self, tool_names: set[str]) -> None:
        super().__init__(tool_names)
        self._seen = 0

    def next_call(self, section: str, final: bool) -> Step:
        start = 0
        while start < len(section) and (section[start].isspace() or section[start] == ";"):
            start += 1
        if section.startswith(PYTHON_TAG, start):
            start += len(PYTHON_TAG)
        elif PYTHON_TAG.startswith(section[start:]) and section[start:] and not final:
            return MORE
        if start >= len(section):
            return Step("done", len(section)) if final else MORE
        if section[start] != "{":
            return Step("done", len(section)) if final else MORE  # chatter after the calls: dropped
        if not final and "}" not in section[max(start, self._seen) :]:
            self._seen = len(section)
            return MORE
        self._seen = len(section)
        obj, end = json_object_at(section, start)
        if obj is None:
            return BAD if final else MORE
        call = named_call(obj, self.tool_names, ("parameters", "arguments"))
        if call is None:
            return BAD
        self._seen = 0
        return Step("call", end, call)

    @classmethod
    def forced_prefix(cls, name: str | None) -> str:
        if name is None:
            return '{"name": "'
        return f'{{"name": {json.dumps(name)}, "parameters": {{'

    @classmethod
    def call_grammar(cls, tools: list[dict]) -> tuple[str, str]:
        return "", one_object_grammar(tools, "parameters")
