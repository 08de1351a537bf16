"""gpt-oss's harmony format: a reply is a run of messages on channels.

    <|channel|>analysis<|message|>The user wants the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "P"}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>

`analysis` is reasoning, `final` (and a `commentary` message to no one, a tool preamble) is
content, and a message addressed `to=functions.NAME` is a call of NAME with its body as
arguments. The generation prompt ends with `<|start|>assistant`, so the reply starts at its
first header. Harmony covers reasoning and tools at once, so it replaces both stages of
`proxy/parsers/stream.py`; its markers are special tokens and are decoded as text.
"""

from __future__ import annotations

import re

from proxy.parsers.base import ToolFormat, arguments_call, named_arguments_grammar, tool_format
from proxy.parsers.stream import Delta, held_back

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"to=functions\.([^\s<]+)")
_HEADER_LIMIT = 512  # a header longer than this is not harmony


@tool_format("harmony", "gpt-oss")
class Harmony(ToolFormat):
    markers = (CHANNEL, START)
    special_tokens = True
    whole_reply = True

    @classmethod
    def reply_stage(cls, tool_names: set[str]) -> HarmonyStream:
        return HarmonyStream(tool_names)

    @classmethod
    def forced_prefix(cls, name: str | None) -> str:
        if name is None:
            return f"{CHANNEL}commentary to=functions."
        return f"{CHANNEL}commentary to=functions.{name} <|constrain|>json{MESSAGE}"

    @classmethod
    def call_grammar(cls, tools: list[dict]) -> tuple[str, str]:
        return f"{CHANNEL}commentary to=functions.", named_arguments_grammar(tools, f" <|constrain|>json{MESSAGE}", "")


class HarmonyStream:
    """Messages read off the reply as it arrives: reasoning and content streamed, calls whole."""

    def __init__(self, tool_names: set[str]) -> None:
        self.tool_names = tool_names
        self.state = "header"  # header | body | plain (the text stopped being harmony)
        self.hold = ""
        self.route = ""  # reasoning | content | call
        self.recipient = ""

    def feed(self, text: str, final: bool) -> Delta:
        self.hold += text
        out = Delta()
        while True:
            if self.state == "plain":
                out.content, self.hold = out.content + self.hold, ""
                break
            if self.state == "header" and (not self.hold or not self._header(final, out)):
                break
            if self.state == "body" and not self._body(final, out):
                break
        return out

    def _header(self, final: bool, out: Delta) -> bool:
        at = self.hold.find(MESSAGE)
        if at < 0:
            head = self.hold.lstrip()
            could_be = any(m.startswith(head[: len(m)]) for m in (START, CHANNEL))
            if final or not could_be or len(self.hold) > _HEADER_LIMIT:
                self.state = "plain"  # not a header: the model's own text
                return True
            return False
        header, self.hold = self.hold[:at], self.hold[at + len(MESSAGE) :]
        channel = _channel(header)
        recipient = _RECIPIENT.search(header)
        if recipient and self.tool_names:
            self.route, self.recipient = "call", recipient.group(1)
        else:
            self.route = "reasoning" if channel == "analysis" else "content"
        self.body = ""
        self.state = "body"
        return True

    def _body(self, final: bool, out: Delta) -> bool:
        ends = [(i, m) for m in ENDS if (i := self.hold.find(m)) >= 0]
        if ends:
            at, marker = min(ends)
            piece, self.hold = self.hold[:at], self.hold[at + len(marker) :]
            self._emit(piece, out)
            self._close(out)
            if self.state == "body":
                self.state = "header"
            return True
        keep = 0 if final else held_back(self.hold, ENDS)
        piece, self.hold = self.hold[: len(self.hold) - keep], self.hold[len(self.hold) - keep :]
        self._emit(piece, out)
        if final:  # the reply ended inside this message (its end marker is the EOS, left out)
            self._close(out)
            if self.state == "body":
                self.state = "header"
        return False

    def _emit(self, piece: str, out: Delta) -> None:
        if self.route == "call":
            self.body += piece
        elif self.route == "reasoning":
            out.reasoning += piece
        else:
            out.content += piece

    def _close(self, out: Delta) -> None:
        if self.route != "call":
            return
        call = arguments_call(self.recipient, self.body.strip(), self.tool_names)
        if call is None:  # a malformed call: its text, and everything after it, is content
            out.content += f"{CHANNEL}commentary to=functions.{self.recipient}{MESSAGE}{self.body}"
            self.state, self.route = "plain", "content"
            return
        out.calls.append(call)
        self.route = "content"


def _channel(header: str) -> str:
    """The channel a header names (`analysis`, `commentary`, `final`), '' if none."""
    _, _, rest = header.partition(CHANNEL)
    words = rest.split()
    return words[0] if words else ""
