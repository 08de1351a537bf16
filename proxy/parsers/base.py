"""What a model family's tool-call format and reasoning markers look like to the reply parser.

A `ToolFormat` names the text that opens a tool section (`markers` anywhere in the reply,
`leading_markers` only as its first non-blank text) and reads one call at a time off the front
of that section (`next_call`), so `proxy/parsers/stream.py` can emit each call the moment its
closing text arrives. A `ReasoningFormat` names the tags around reasoning text. Families
register themselves by name (`@tool_format("hermes")`); `proxy/parsers/__init__.py` picks one
from the chat template or from `[engine] tool_parser` / `reasoning_parser`.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

TOOL_FORMATS: dict[str, type[ToolFormat]] = {}
REASONING_FORMATS: dict[str, ReasoningFormat] = {}


def tool_format(*names: str):
    """Register a `ToolFormat` class under `names` (a duplicate name raises at import)."""

    def register(cls: type[ToolFormat]) -> type[ToolFormat]:
        for name in names:
            if name in TOOL_FORMATS:
                raise ValueError(f"tool parser {name!r} is registered twice")
            TOOL_FORMATS[name] = cls
        cls.name = names[0]
        return cls

    return register


def reasoning_format(fmt: ReasoningFormat, *names: str) -> None:
    for name in names:
        if name in REASONING_FORMATS:
            raise ValueError(f"reasoning parser {name!r} is registered twice")
        REASONING_FORMATS[name] = fmt


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def function_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A chat `tool_calls` entry: arguments as a JSON string (non-ASCII kept as is)."""
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


@dataclass(frozen=True)
class Step:
    """What `ToolFormat.next_call` read off the front of the tool section.

    call: a complete, valid call took `used` characters. skip: `used` characters of framing
    (a list's brackets) come before the next call. more: the section may still become a call;
    wait for text. bad: it cannot (broken JSON, a tool not offered): the rest is plain content.
    done (only once no more text will come): `used` characters of closing text or trailing
    chatter are dropped.
    """

    kind: Literal["call", "skip", "more", "bad", "done"]
    used: int = 0
    call: dict[str, Any] | None = None


MORE, BAD = Step("more"), Step("bad")

_DECODER = json.JSONDecoder()


def json_object_at(text: str, start: int) -> tuple[dict[str, Any] | None, int]:
    """The JSON object starting at `text[start]` (after blanks) and the index after it; (None, -1)
    while it is incomplete or broken (the caller tells those apart by whether more text can come)."""
    while start < len(text) and text[start].isspace():
        start += 1
    try:
        obj, end = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None, -1
    return (obj, end) if isinstance(obj, dict) else (None, -1)


def named_call(obj: dict[str, Any], tool_names: set[str], args_keys: tuple[str, ...]) -> dict[str, Any] | None:
    """`{"name": .., <args key>: {..}}` as a call, or None when it names no offered tool or its
    arguments are not an object (a JSON string holding an object is accepted)."""
    name = obj.get("name")
    if not isinstance(name, str) or name not in tool_names:
        return None
    args: Any = {}
    for key in args_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return function_call(name, args) if isinstance(args, dict) else None


def arguments_call(name: str, raw: str, tool_names: set[str]) -> dict[str, Any] | None:
    """A call from a tool name and its arguments' JSON text, or None."""
    if name not in tool_names:
        return None
    try:
        args = json.loads(raw)
    except json.JSONDecodeError:
        return None
    return function_call(name, args) if isinstance(args, dict) else None


class ToolFormat:
    """One family's tool-call text. An instance serves one reply (it may keep parsing state)."""

    name: ClassVar[str] = ""
    markers: ClassVar[tuple[str, ...]] = ()
    """Text that opens the tool section wherever it appears."""
    leading_markers: ClassVar[tuple[str, ...]] = ()
    """Text that opens the tool section only as the reply's first non-blank text."""
    special_tokens: ClassVar[bool] = False
    """The markers may be special tokens in the family's vocabulary: decode without skipping them."""

    def __init__(self, tool_names: set[str]) -> None:
        self.tool_names = tool_names

    @classmethod
    def reply_stage(cls, tool_names: set[str]) -> Any:
        """A parser of the whole reply (reasoning, content and calls at once, with
        `feed(text, final) -> Delta`) for formats where those are not separable stages; None for
        the rest, whose replies go through the reasoning and tool-section stages."""
        return None

    def next_call(self, section: str, final: bool) -> Step:
        """Read the next call off the front of `section` (which starts at a marker, or where the
        previous call ended); `final`: no more text will come."""
        raise NotImplementedError

    @classmethod
    def forced_prefix(cls, name: str | None) -> str:
        """The reply's start when a call is required: of tool `name`, or of any tool (None)."""
        raise NotImplementedError

    @classmethod
    def call_grammar(cls, tools: list[dict[str, Any]]) -> tuple[str, str]:
        """(prefix, grammar): when a call is required, the reply starts with `prefix` and the rest
        is held by `grammar` (llguidance's Lark dialect, arguments as `%json` rules) to one call of
        one of `tools` in this format, its arguments valid against the tool's parameters."""
        raise NotImplementedError


def call_schema(tool: dict[str, Any], args_key: str) -> dict[str, Any]:
    """The JSON schema of `{"name": <this tool>, args_key: <its arguments>}`."""
    fn = tool["function"]
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, args_key: arguments_schema(tool)},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The tool's parameters as a required call's grammar holds them: an object that declares its
    `properties` and says nothing of others takes only those (`closed`)."""
    return closed(tool["function"].get("parameters") or {"type": "object"})


# not `not`, `if` or `contains`: they select values, and closing them would change what they select
_SUBSCHEMA = ("items", "additionalProperties", "then", "else")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any, composed: bool = False) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that lists `properties`
    and is silent on other keys (no `additionalProperties`, `patternProperties` or
    `unevaluatedProperties`). JSON Schema lets such an object take any other key, and a grammar
    that follows it lets a small model write a free-text key until `max_tokens` (seen: a key
    `"a': 3}} building blocks..."` in a forced call); a function's arguments are its declared
    parameters, as OpenAI's strict mode requires. Schemas composed with others stay open: the
    members of an `allOf`, those of an `anyOf`/`oneOf` whose parent lists properties too, and a
    parent that lists properties beside an `allOf`/`anyOf`/`oneOf`; closing them would refuse
    the keys the others declare."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(out.get(key), list):
            beside = key == "allOf" or "properties" in out
            out[key] = [closed(s, composed=beside) for s in out[key]]
    if isinstance(out.get("prefixItems"), list):
        out["prefixItems"] = [closed(s) for s in out["prefixItems"]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(s) for name, s in out[key].items()}
    silent = not any(k in out for k in ("additionalProperties", "patternProperties", "unevaluatedProperties"))
    combined = composed or any(k in out for k in ("allOf", "anyOf", "oneOf"))
    if isinstance(out.get("properties"), dict) and silent and not combined:
        out["additionalProperties"] = False
    return out


def lark_json(rule: str, schema: dict[str, Any]) -> str:
    """A `%json` rule; its JSON is written as `json.dumps` writes it (no free whitespace, which a
    small model can fill forever)."""
    layout = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
    return f"{rule}: %json {json.dumps({**schema, 'x-guidance': layout}, ensure_ascii=False)}"


def lark_text(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def one_object_grammar(tools: list[dict[str, Any]], args_key: str, after: str = "") -> str:
    """A grammar of one `{"name", args_key}` object naming one of `tools`, then the text `after`."""
    schemas = [call_schema(t, args_key) for t in tools]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    tail = f" {lark_text(after)}" if after else ""
    return f"start: call{tail}\n{lark_json('call', schema)}"


def named_arguments_grammar(tools: list[dict[str, Any]], head: str, tail: str) -> str:
    """A grammar of `NAME` + `head` + the tool's arguments + `tail`, for one of `tools`."""
    rules, alternatives = [], []
    for i, tool in enumerate(tools):
        closing = f" {lark_text(tail)}" if tail else ""
        alternatives.append(f"{lark_text(tool['function']['name'] + head)} args{i}{closing}")
        rules.append(lark_json(f"args{i}", arguments_schema(tool)))
    return "\n".join([f"start: {' | '.join(alternatives)}", *rules])


@dataclass(frozen=True)
class ReasoningFormat:
    start: str
    end: str
