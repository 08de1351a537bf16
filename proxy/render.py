"""Prompt token ids from chat messages: templates, tools, and token-exact continuation.

The model's own chat template renders the conversation. Templates that take
`tools` get them natively (arguments JSON-parsed first, as vLLM and SGLang do);
for templates that ignore tools (SmolLM2's), a Hermes-style tool section is added
to the system message and earlier tool calls / results are written in the same
`<tool_call>` / `<tool_response>` tags the model is asked to produce.

Continuation never retokenizes history: a child turn's prompt is the parent's
exact prompt + sampled ids, then only the newly rendered text after the parent's
reply — the template's end-of-turn glue plus the new messages — is tokenized.
When the template renders the history differently from what was sampled (its
earlier turns re-rendered, or the parent's sampled reasoning left out), the
prompt is the template's whole rendering instead: a new token sequence.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.errors import invalid_request
from proxy.parsers import choose
from proxy.prompt_encoder import PromptEncoder

log = logging.getLogger("areal_proxy")

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

_TOOL_SECTION = """# Tools

You can call functions to help answer. The available functions are listed as JSON \
signatures between <tools> and </tools>:
<tools>
{signatures}
</tools>

To call a function, reply with a JSON object holding its name and arguments between \
<tool_call> and </tool_call>, one block per call, for example:
<tool_call>
{example}
</tool_call>"""

_SECTIONS_KEPT = 256  # tool sections kept, by their tools' JSON; a deployment's agents have a few sets
_PLACEHOLDERS = {"string": "...", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}


def _example_call(tool: dict[str, Any]) -> str:
    """A call of the first tool with placeholder arguments: small models copy concrete shapes best."""
    fn = tool.get("function", {})
    props = (fn.get("parameters") or {}).get("properties") or {}
    required = (fn.get("parameters") or {}).get("required") or list(props)[:1]
    args = {k: _PLACEHOLDERS.get((props.get(k) or {}).get("type", "string"), "...") for k in required if k in props}
    return json.dumps({"name": fn.get("name", "function_name"), "arguments": args})


@dataclass(frozen=True)
class ParentTokens:
    """What continuation needs of a parent completion."""

    full_ids: list[int]  # its prompt ids + sampled ids
    num_messages: int  # len(its request messages) + 1 (its reply)
    ended_with_eos: bool
    reasoning: str = ""  # the reasoning its reply sampled


@dataclass(frozen=True)
class Prompt:
    ids: list[int]  # the full prompt
    new_ids: list[int]  # ids beyond the parent's full sequence (all ids for a root)
    parent_used: bool
    forced_prefix: str = ""  # text appended to the prompt that the reply is read as starting with
    reasoning_open: bool = False  # the prompt opens a reasoning block: the reply begins inside it


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return arguments  # the model's broken JSON is shown back to it verbatim


class Renderer:
    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: tuple[int, ...],
        chat_template: str = "",
        tool_parser: str = "auto",
        reasoning_parser: str = "auto",
    ) -> None:
        self.tokenizer = tokenizer
        if chat_template:
            tokenizer.chat_template = chat_template
        template = tokenizer.chat_template or ""
        if not template:
            raise ValueError("the tokenizer has no chat template; pass a chat model or set engine.chat_template")
        self.native_tools = "tools" in template
        self.parsers = choose(template, self.native_tools, tool_parser, reasoning_parser, eos_token_ids)
        self.eos_texts = sorted(
            {tokenizer.convert_ids_to_tokens(i) for i in eos_token_ids if i is not None}, key=len, reverse=True
        )
        self._eos_ids = set(eos_token_ids)
        self.encoder = PromptEncoder(tokenizer)
        self._sections: dict[bytes, str] = {}
        compiled, self._variables = _compiled_template(tokenizer, template)
        self._compiled = compiled if compiled is not None and self._renders_as_transformers(compiled) else None

    # -- rendering ------------------------------------------------------------------
    def _template_messages(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[dict]:
        out = []
        for m in messages:
            t: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
            if self.native_tools:
                if m.get("tool_calls"):
                    t["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {
                                "name": c["function"]["name"],
                                "arguments": _arguments_object(c["function"]["arguments"]),
                            },
                        }
                        for c in m["tool_calls"]
                    ]
                if m.get("tool_call_id"):
                    t["tool_call_id"] = m["tool_call_id"]
                if m.get("reasoning_content"):
                    t["reasoning_content"] = m["reasoning_content"]
                if m.get("name"):
                    t["name"] = m["name"]
            else:
                if m.get("tool_calls"):
                    blocks = [_tool_call_block(c) for c in m["tool_calls"]]
                    t["content"] = "\n".join([t["content"], *blocks] if t["content"] else blocks)
                if m["role"] == "tool":
                    t = {"role": "tool", "content": f"<tool_response>\n{t['content']}\n</tool_response>"}
            out.append(t)
        if tools and not self.native_tools:
            section = self._tool_section(tools)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section}
            else:
                out.insert(0, {"role": "system", "content": section})
        return out

    def _tool_section(self, tools: list[dict]) -> str:
        """The system prompt's tool section; an agent sends the same tools on every call, so the
        section is kept by the tools' compact JSON (the same text, a twentieth of the cost)."""
        key = orjson.dumps(tools)
        section = self._sections.get(key)
        if section is None:
            signatures = "\n".join(json.dumps(tool) for tool in tools)
            section = _TOOL_SECTION.format(signatures=signatures, example=_example_call(tools[0]))
            if len(self._sections) >= _SECTIONS_KEPT:
                self._sections.clear()
            self._sections[key] = section
        return section

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
        try:
            return self._render(self._template_messages(messages, tools), tools, generation_prompt)
        except Exception as exc:  # template-raised errors are the caller's message shape
            raise invalid_request(f"the model's chat template rejected these messages: {exc}", "messages") from None

    def _render(self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool) -> str:
        """`apply_chat_template(messages, tools, tokenize=False)`. Straight through the compiled template
        where that renders the same (checked at start-up): transformers' own preparation of the call
        (copies of every message and tool, the special tokens looked up again) cost as much as the
        rendering, ~6% of the proxy's CPU a call."""
        tools = tools if tools and self.native_tools else None
        if self._compiled is not None:
            return self._render_compiled(self._compiled, messages, tools, generation_prompt)
        return self._render_transformers(messages, tools, generation_prompt)

    def _render_compiled(
        self, compiled: Any, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool
    ) -> str:
        return compiled.render(
            messages=[_with_reasoning_aliases(m) for m in messages],
            tools=tools,
            documents=None,
            add_generation_prompt=generation_prompt,
            **self._variables,
        )

    def _render_transformers(
        self, messages: list[dict[str, Any]], tools: list[dict] | None, generation_prompt: bool
    ) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation_prompt}
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(messages, **kwargs)

    def _renders_as_transformers(self, compiled: Any) -> bool:
        """Whether `compiled` renders sample conversations of every shape (a system prompt, tools, tool
        calls and results, reasoning, with and without the generation prompt) exactly as
        `apply_chat_template` does; if not (a transformers that prepares its inputs otherwise), every
        call goes through `apply_chat_template`."""
        for messages, tools in _SAMPLES:
            template_messages = self._template_messages(messages, tools)
            tools = tools if tools and self.native_tools else None
            for generation_prompt in (True, False):
                try:
                    expected: Any = self._render_transformers(template_messages, tools, generation_prompt)
                except Exception as exc:  # a template that refuses this shape must refuse it both ways
                    expected = type(exc)
                try:
                    got: Any = self._render_compiled(compiled, template_messages, tools, generation_prompt)
                except Exception as exc:
                    got = type(exc)
                if got != expected:
                    log.warning("the chat template is rendered through transformers: its direct rendering differs")
                    return False
        return True

    def encode(self, text: str) -> list[int]:
        return self.encoder.encode(text)

    # -- prompts --------------------------------------------------------------------
    def prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict] | None,
        parent: ParentTokens | None,
        forced_prefix: str = "",
        reasoning: bool = True,
    ) -> Prompt:
        """The prompt for `messages`, continuing `parent`'s exact tokens when it applies.

        `forced_prefix` (a required tool call's opening) follows the generation prompt; when that
        prompt opens a reasoning block, the block is closed first. Without `reasoning` the reply
        opens with an empty reasoning block, as Qwen3's `enable_thinking=False` renders it (a
        family without reasoning markers is unchanged)."""
        text = self.render(messages, tools, generation_prompt=True)
        think = self.parsers.reasoning
        reasoning_open = think is not None and text.rstrip().endswith(think.start)
        if think is not None and not reasoning:
            opening = "" if reasoning_open else f"{think.start}\n\n"
            forced_prefix = f"{opening}{think.end}\n\n{forced_prefix}"
        elif forced_prefix and reasoning_open:
            forced_prefix = f"{think.end}\n\n{forced_prefix}"
        full_text = text + forced_prefix
        shape = {"forced_prefix": forced_prefix, "reasoning_open": reasoning_open}
        if parent is not None:
            glue_and_suffix = self._continuation_text(messages, tools, parent, full_text)
            if glue_and_suffix is not None:
                new_ids = self.encode(glue_and_suffix)
                return Prompt(ids=parent.full_ids + new_ids, new_ids=new_ids, parent_used=True, **shape)
        ids = self.encode(full_text)
        return Prompt(ids=ids, new_ids=ids, parent_used=False, **shape)

    def _continuation_text(
        self, messages: list[dict[str, Any]], tools: list[dict] | None, parent: ParentTokens, full_text: str
    ) -> str | None:
        k = parent.num_messages
        upto_reply = self.render(messages[:k], tools, generation_prompt=False)
        if not full_text.startswith(upto_reply):
            return None  # the template re-renders history differently: a new token sequence
        reply_start = self.render(messages[: k - 1], tools, generation_prompt=True)
        region_start = len(reply_start) if upto_reply.startswith(reply_start) else 0
        region = upto_reply[region_start:]
        if parent.reasoning.strip() and parent.reasoning.strip() not in region:
            return None  # the template leaves out the reasoning the parent sampled (or the client dropped it)
        cut = -1
        for eos in self.eos_texts:
            cut = region.rfind(eos)
            if cut >= 0:
                glue = region[cut + len(eos) :] if parent.ended_with_eos else region[cut:]
                break
        if cut < 0:
            glue = ""
        return glue + full_text[len(upto_reply) :]

    def ends_with_eos(self, output_ids: list[int]) -> bool:
        return bool(output_ids) and output_ids[-1] in self._eos_ids


def _compiled_template(tokenizer: Any, template: Any) -> tuple[Any, dict[str, Any]]:
    """The template compiled as transformers compiles it (cached by its text) and the variables
    `apply_chat_template` adds (the special tokens); None for a tokenizer with several named templates
    (transformers picks one a call) or a transformers without that compiler."""
    if not isinstance(template, str):
        return None, {}
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(template), dict(tokenizer.special_tokens_map)
    except Exception:  # an older or newer transformers: apply_chat_template it is
        return None, {}


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    """A message's reasoning under each name templates read it by (gpt-oss's `thinking`), as
    transformers passes it."""
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    return message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}


_SAMPLE_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
_SAMPLE_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
# Conversations of every shape the proxy renders, for `Renderer._renders_as_transformers`.
_SAMPLES: list[tuple[list[dict[str, Any]], list[dict] | None]] = [
    ([{"role": "user", "content": "Hi"}], None),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting."},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        None,
    ),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [_SAMPLE_CALL], "reasoning_content": "The tool."},
            {"role": "tool", "content": "18 C", "tool_call_id": "call_1", "name": "get_weather"},
        ],
        [_SAMPLE_TOOL],
    ),
    ([{"role": "user", "content": "Weather in Paris?"}], [_SAMPLE_TOOL]),
]


def load_template(value: str) -> str:
    """`[engine] chat_template`: a path to a Jinja file, or the template itself ('' keeps the model's)."""
    if not value or "{" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"engine.chat_template {value!r} is neither a file nor a Jinja template")
    return path.read_text()


def _tool_call_block(call: dict[str, Any]) -> str:
    fn = call["function"]
    payload = {"name": fn["name"], "arguments": _arguments_object(fn["arguments"])}
    return f"{TOOL_CALL_OPEN}\n{json.dumps(payload, ensure_ascii=False)}\n{TOOL_CALL_CLOSE}"
