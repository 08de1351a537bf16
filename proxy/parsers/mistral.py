"""Mistral calls after the `[TOOL_CALLS]` control token, in either of its tokenizers' forms.

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {...}]   (v3 tokenizers)
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{...}     (v11+ tokenizers)

`[TOOL_CALLS]` and `[ARGS]` are special tokens in Mistral's vocabularies, so replies are decoded
with special tokens kept.
"""

from __future__ import annotations

import json

from proxy.parsers.base import (
    BAD,
    MORE,
    Step,
    ToolFormat,
    arguments_call,
    json_object_at,
    named_call,
    one_object_grammar,
    tool_format,
)

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_DECODER = json.JSONDecoder()


@tool_format("mistral")
class Mistral(ToolFormat):
    markers = (TOOL_CALLS,)
    special_tokens = True

    def __init__(self, tool_names: set[str]) -> None:
        super().__init__(tool_names)
        self._seen = 0
        self._in_list = False  # inside a `[{...}, {...}]` list of calls

    def next_call(self, section: str, final: bool) -> Step:
        i = _skip(section, 0, " \n\t,")
        if self._in_list:
            if i >= len(section):
                return Step("done", len(section)) if final else MORE
            if section[i] == "]":
                self._in_list = False
                return Step("skip", i + 1)
            return self._object(section, i, final)
        at = section.find(TOOL_CALLS, i)
        if at < 0:  # chatter after the calls: dropped, unless another [TOOL_CALLS] follows
            return Step("done", len(section)) if final else MORE
        j = _skip(section, at + len(TOOL_CALLS), " \n\t")
        if j >= len(section):
            return BAD if final else MORE
        if section[j] == "[":
            self._in_list = True
            return Step("skip", j + 1)
        return self._named(section, j, final)

    def _object(self, section: str, i: int, final: bool) -> Step:
        if not final and "}" not in section[max(i, self._seen) :]:
            self._seen = len(section)
            return MORE
        self._seen = len(section)
        obj, end = json_object_at(section, i)
        if obj is None:
            return BAD if final else MORE
        call = named_call(obj, self.tool_names, ("arguments", "parameters"))
        if call is None:
            return BAD
        self._seen = 0
        return Step("call", end, call)

    def _named(self, section: str, i: int, final: bool) -> Step:
        args_at = section.find(ARGS, i)
        if args_at < 0:
            return BAD if final or len(section) - i > 128 else MORE
        name = section[i:args_at].strip()
        body = args_at + len(ARGS)
        if not final and "}" not in section[max(body, self._seen) :]:
            self._seen = len(section)
            return MORE
        self._seen = len(section)
        j = _skip(section, body, " \n\t")
        try:
            _, end = _DECODER.raw_decode(section, j)
        except json.JSONDecodeError:
            return BAD if final else MORE
        call = arguments_call(name, section[j:end], self.tool_names)
        if call is None:
            return BAD
        self._seen = 0
        return Step("call", end, call)

    @classmethod
    def forced_prefix(cls, name: str | None) -> str:
        if name is None:
            return f'{TOOL_CALLS}[{{"name": "'
        return f'{TOOL_CALLS}[{{"name": {json.dumps(name)}, "arguments": {{'

    @classmethod
    def call_grammar(cls, tools: list[dict]) -> tuple[str, str]:
        return f"{TOOL_CALLS}[", one_object_grammar(tools, "arguments", "]")


def _skip(text: str, i: int, chars: str) -> int:
    while i < len(text) and text[i] in chars:
        i += 1
    return i
