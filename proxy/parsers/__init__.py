"""Tool-call and reasoning parsers per model family, chosen from the chat template or by name.

`choose` reads the family off the template's own markers (`<tool_call>`: Hermes/Qwen,
`[TOOL_CALLS]`: Mistral, DeepSeek's tool-call marker tokens, Llama 3's `<|python_tag|>`
headers, gpt-oss's harmony `<|channel|>`; `<think>` for reasoning); `[engine] tool_parser` /
`reasoning_parser` name one instead.
A template that renders no tools gets the generic Hermes-style section (`proxy/render.py`), so
its replies are read as Hermes. Adding a family is one module that registers a `ToolFormat`.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.parsers import deepseek, harmony, hermes, llama3, mistral, reasoning
from proxy.parsers.base import REASONING_FORMATS, TOOL_FORMATS, ReasoningFormat, ToolFormat

_FAMILY_MARKERS = (
    (harmony.CHANNEL, "harmony"),
    (deepseek.CALLS_BEGIN, "deepseek_v3"),
    (mistral.TOOL_CALLS, "mistral"),
    (hermes.OPEN, "hermes"),
    (llama3.PYTHON_TAG, "llama3_json"),
    ("<|start_header_id|>", "llama3_json"),
)


@dataclass(frozen=True)
class Parsers:
    """The reply parsers of the served model."""

    tool_format: type[ToolFormat]
    reasoning: ReasoningFormat | None = None
    eos_ids: frozenset[int] = frozenset()

    def tool(self, tool_names: set[str]) -> ToolFormat:
        return self.tool_format(tool_names)

    @property
    def names(self) -> tuple[str, str]:
        if self.tool_format.reply_stage(set()) is not None:
            return self.tool_format.name, self.tool_format.name  # one parser reads both
        reasoning = next((k for k, v in REASONING_FORMATS.items() if v == self.reasoning), "none")
        return self.tool_format.name, reasoning

    @classmethod
    def default(cls) -> Parsers:
        return cls(hermes.Hermes)


def choose(
    template: str, native_tools: bool, tool_parser: str = "auto", reasoning_parser: str = "auto", eos_ids=()
) -> Parsers:
    """The parsers for a model with chat `template` (names override detection; 'none': no reasoning)."""
    if tool_parser != "auto":
        if tool_parser not in TOOL_FORMATS:
            names = ", ".join(["auto", *sorted(TOOL_FORMATS)])
            raise ValueError(f"engine.tool_parser {tool_parser!r} is not one of: {names}")
        tool = TOOL_FORMATS[tool_parser]
    else:
        name = "hermes"
        if native_tools:
            name = next((n for marker, n in _FAMILY_MARKERS if marker in template), "hermes")
        tool = TOOL_FORMATS[name]
    if tool.reply_stage(set()) is not None:  # harmony: reasoning is one of its channels
        found = None
    elif reasoning_parser == "auto":
        found = reasoning.THINK if reasoning.THINK.start in template and reasoning.THINK.end in template else None
    elif reasoning_parser == "none":
        found = None
    elif reasoning_parser in REASONING_FORMATS:
        found = REASONING_FORMATS[reasoning_parser]
    else:
        names = ", ".join(["auto", "none", *sorted(REASONING_FORMATS)])
        raise ValueError(f"engine.reasoning_parser {reasoning_parser!r} is not one of: {names}")
    return Parsers(tool, found, frozenset(i for i in eos_ids if i is not None))


__all__ = ["REASONING_FORMATS", "TOOL_FORMATS", "Parsers", "choose"]
