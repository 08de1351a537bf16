"""Hermes-style calls (Qwen2.5, Qwen3, NousResearch Hermes; the generic fallback's format too).

    Let me check.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>
    <tool_call>
    {"name": "get_time", "arguments": {"tz": "CET"}}
    </tool_call>

One JSON object per block (`arguments`, or `parameters` as some fine-tunes write). Text the
model runs on with after an object (a missing or cut-off closing tag) is dropped, as the engines'
parsers drop it.
"""

from __future__ import annotations

import json

from proxy.parsers.base import BAD, MORE, Step, ToolFormat, json_object_at, named_call, one_object_grammar, tool_format

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@tool_format("hermes", "qwen3", "qwen2.5")
class Hermes(ToolFormat):
    markers = (OPEN,)

    def __init__(self, tool_names: set[str]) -> None:
        super().__init__(tool_names)
        self._seen = 0  # section length at the last parse attempt: only a new '}' can end an object
        self._read: tuple[int, dict] | None = None  # an object read, its closing tag still to come

    def next_call(self, section: str, final: bool) -> Step:
        start = section.find(OPEN)
        if start < 0:  # chatter after the last call: dropped, unless a block follows
            return Step("done", len(section)) if final else MORE
        body = start + len(OPEN)
        nxt = section.find(OPEN, body)
        if self._read is None:
            if not final and nxt < 0 and "}" not in section[max(body, self._seen) :]:
                self._seen = len(section)
                return MORE
            self._seen = len(section)
            obj, end = json_object_at(section, body)
            if obj is None:
                return BAD if final or nxt >= 0 or CLOSE in section[body:] else MORE
            call = named_call(obj, self.tool_names, ("arguments", "parameters"))
            if call is None:
                return BAD
            self._read = (end, call)
        end, call = self._read
        tail = section[end:].lstrip()
        if not final and nxt < 0 and CLOSE.startswith(tail) and tail != CLOSE:
            return MORE  # the closing tag may still be arriving
        close = section.find(CLOSE, end)
        if close >= 0 and (nxt < 0 or close < nxt):
            used = close + len(CLOSE)
        else:  # no closing tag: what the model ran on with, up to the next block, is dropped
            used = nxt if nxt >= 0 else len(section)
        self._seen, self._read = 0, None
        return Step("call", used, call)

    @classmethod
    def forced_prefix(cls, name: str | None) -> str:
        if name is None:
            return f'{OPEN}\n{{"name": "'
        return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": {{'

    @classmethod
    def call_grammar(cls, tools: list[dict]) -> tuple[str, str]:
        return f"{OPEN}\n", one_object_grammar(tools, "arguments", f"\n{CLOSE}")
