"""From sampled token ids to the assistant message: text, stop strings, reasoning, tool calls.

`ReplyBuilder` is fed token ids as the engine produces them and returns what can safely be
streamed: it holds back an incomplete UTF-8 character and any tail that could still become a
stop string; the settled text then goes through the model family's parsers
(`proxy/parsers/stream.py`): reasoning between think tags, content, and tool calls each emitted
the moment its closing text arrives. Detokenization is incremental: each token decodes only a
short window of the ids before it (for the spacing a token's neighbours decide), so a 4,000-token
stream costs 4,000 small decodes, not 4,000 decodes of a growing text. `finish()` returns the
final message: the concatenation of every delta, the same whether the client streamed or not,
so the message the client echoes next turn matches the stored one exactly.

The family's tool format comes from `proxy/parsers/` (Hermes `<tool_call>` blocks for the
default model). A block that is not valid JSON, lacks a name, or names a tool the request did
not offer stays plain content with everything after it: the client always receives a
well-formed message, and the sampled tokens are recorded as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.parsers import Parsers
from proxy.parsers.stream import Delta, ReasoningSplitter, ToolSection, held_back


@dataclass
class Reply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"
    reasoning: str | None = None
    stop_sequence: str | None = None  # the stop string that ended the reply, if one did

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


class ReplyBuilder:
    """Incremental detokenization, stop strings, and the family's reasoning and tool parsers."""

    def __init__(
        self,
        tokenizer: Any,
        stop: list[str] | None = None,
        tool_names: set[str] | None = None,
        forced_prefix: str = "",
        parsers: Parsers | None = None,
        reasoning_open: bool = False,
    ) -> None:
        parsers = parsers or Parsers.default()
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        tool_format = parsers.tool(tool_names) if tool_names else None
        self.whole = parsers.tool_format.reply_stage(tool_names or set())  # harmony: one parser for all
        self.skip_special = self.whole is None and not (tool_format is not None and tool_format.special_tokens)
        self.eos_ids = parsers.eos_ids
        self.reasoning = ReasoningSplitter(parsers.reasoning, reasoning_open) if parsers.reasoning else None
        self.tools = ToolSection(tool_format)
        self.ids: list[int] = []
        self.text = forced_prefix  # decoded text so far (before stop trimming)
        self._window = 0  # ids from here on are decoded together: context for the newest
        self._read = 0  # ids before this are in `text`
        self._settled = 0  # chars of `text` handed to the parsers
        self.stopped_at: int | None = None  # index in text where a stop string begins
        self.stop_sequence: str | None = None
        self.out = Delta()  # everything emitted so far

    def feed(self, token_ids: list[int]) -> Delta:
        """Add sampled ids; return what may be streamed now (empty if nothing)."""
        if self.stopped_at is not None:
            return Delta()
        self.ids.extend(t for t in token_ids if self.skip_special or t not in self.eos_ids)
        scanned = len(self.text)
        if not self._decode_new():
            return Delta()  # an incomplete multi-byte character: wait for the next token
        self._find_stops(scanned)
        return self._settle(final=False)

    def _find_stops(self, scanned: int) -> None:
        """Look for stop strings in what `text` gained past `scanned` (and across that border)."""
        for s in self.stop:
            at = self.text.find(s, max(0, scanned - len(s) + 1))
            if at >= 0 and (self.stopped_at is None or at < self.stopped_at):
                self.stopped_at, self.stop_sequence = at, s

    def _decode_new(self, final: bool = False) -> bool:
        """Append the text of ids not yet decoded; False while it ends in an incomplete character
        (unless `final`). Decoding [window:] against [window:read] gives the new ids' text with
        the spacing their predecessors imply; the concatenation equals decoding every id at once."""
        skip = self.skip_special
        before = self.tokenizer.decode(self.ids[self._window : self._read], skip_special_tokens=skip)
        after = self.tokenizer.decode(self.ids[self._window :], skip_special_tokens=skip)
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return False
        self.text += after[len(before) :]
        self._window, self._read = self._read, len(self.ids)
        return True

    def _settle(self, final: bool) -> Delta:
        """Hand the text no stop string can still claim to the parsers; return what they emit."""
        visible = self.text if self.stopped_at is None else self.text[: self.stopped_at]
        end = len(visible)
        if not final and self.stopped_at is None:
            end -= held_back(visible, self.stop)
        new = visible[self._settled : max(end, self._settled)]
        self._settled = max(end, self._settled)
        if self.whole is not None:
            d = self.whole.feed(new, final)
            reasoning, content, calls = d.reasoning, d.content, d.calls
        else:
            reasoning, text = self.reasoning.feed(new, final) if self.reasoning else ("", new)
            content, calls = self.tools.feed(text, final)
        self.out.reasoning += reasoning
        self.out.content += content
        self.out.calls.extend(calls)
        return Delta(reasoning, content, calls)

    def finish(self, finish_reason: str) -> tuple[Delta, Reply]:
        """Flush at the end of generation: (the last delta, the final reply)."""
        if self.stopped_at is None and self._read < len(self.ids):
            scanned = len(self.text)
            self._decode_new(final=True)  # held back waiting for a character that never completed
            self._find_stops(scanned)
        rest = self._settle(final=True)
        out = self.out
        reasoning = out.reasoning or None
        if out.calls:
            reply = Reply(out.content or None, list(out.calls), "tool_calls", reasoning, self.stop_sequence)
        else:
            reason = "stop" if self.stopped_at is not None else finish_reason
            reply = Reply(out.content, [], reason, reasoning, self.stop_sequence)
        return rest, reply
