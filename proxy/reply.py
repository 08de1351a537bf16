"""From sampled token ids to the assistant message: text, stop strings, tool calls.

`ReplyBuilder` is fed token ids as the engine produces them and yields the text
that can safely be streamed: it holds back an incomplete UTF-8 character, any
tail that could still become a stop string or a `<tool_call>` tag, and trailing
whitespace (dropped when a tool call follows). Detokenization is incremental: each
token decodes only a short window of the ids before it (for the spacing a token's
neighbours decide), so a 4,000-token stream costs 4,000 small decodes, not 4,000
decodes of a growing text. When generation ends, `finish()`
returns the final message — the same one whether the client streamed or not, so
the message the client echoes next turn matches the stored one exactly.

Tool calls follow the Hermes convention: `<tool_call>{"name", "arguments"}</tool_call>`
blocks after optional text. A block that is not valid JSON, lacks a name, or names
a tool the request did not offer makes the whole output plain content: the client
always receives a well-formed message, and the sampled tokens are recorded as is.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from typing import Any

from proxy.render import TOOL_CALL_OPEN


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass
class Reply:
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str = "stop"

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def parse_tool_calls(text: str, tool_names: set[str] | None) -> tuple[str | None, list[dict[str, Any]]]:
    """Split `text` into (content, tool_calls); (text, []) when there is no valid call.

    Each `<tool_call>` must hold one complete JSON object naming an offered tool; what
    follows the object up to the next block — the closing tag, or text the model ran on
    with (a missing or cut-off `</tool_call>`) — is dropped, as engines' parsers drop it.
    """
    start = text.find(TOOL_CALL_OPEN)
    if start < 0 or not tool_names:
        return text, []
    calls = []
    pos = start
    while pos >= 0:
        body_start = pos + len(TOOL_CALL_OPEN)
        nxt = text.find(TOOL_CALL_OPEN, body_start)
        body = text[body_start:] if nxt < 0 else text[body_start:nxt]
        call = _parse_call(body, tool_names)
        if call is None:
            return text, []
        calls.append(call)
        pos = nxt
    content = text[:start].rstrip()
    return (content or None), calls


_DECODER = json.JSONDecoder()


def _parse_call(body: str, tool_names: set[str]) -> dict[str, Any] | None:
    try:
        obj, _ = _DECODER.raw_decode(body.lstrip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or obj["name"] not in tool_names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {
        "id": new_call_id(),
        "type": "function",
        "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)},
    }


class ReplyBuilder:
    """Incremental detokenization with stop strings and tool-call detection."""

    def __init__(
        self,
        tokenizer: Any,
        stop: list[str] | None = None,
        tool_names: set[str] | None = None,
        forced_prefix: str = "",
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = [s for s in (stop or []) if s]
        self.tool_names = tool_names or set()
        self.prefix = forced_prefix
        self.ids: list[int] = []
        self.text = forced_prefix  # decoded text so far (before stop trimming)
        self._window = 0  # ids from here on are decoded together: context for the newest
        self._read = 0  # ids before this are in `text`
        self.sent = 0  # chars of `text` already streamed as content
        self.stopped_at: int | None = None  # index in text where a stop string begins
        self.in_tool_section = bool(forced_prefix) and TOOL_CALL_OPEN in forced_prefix

    def feed(self, token_ids: list[int]) -> str:
        """Add sampled ids; return new content that is safe to stream ('' if none)."""
        if self.stopped_at is not None:
            return ""
        self.ids.extend(token_ids)
        scanned = len(self.text)
        if not self._decode_new():
            return ""  # an incomplete multi-byte character: wait for the next token
        self._find_stops(scanned)
        return self._streamable()

    def _find_stops(self, scanned: int) -> None:
        """Look for stop strings in what `text` gained past `scanned` (and across that border)."""
        for s in self.stop:
            at = self.text.find(s, max(0, scanned - len(s) + 1))
            if at >= 0 and (self.stopped_at is None or at < self.stopped_at):
                self.stopped_at = at

    def _decode_new(self, final: bool = False) -> bool:
        """Append the text of ids not yet decoded; False while it ends in an incomplete character
        (unless `final`). Decoding [window:] against [window:read] gives the new ids' text with
        the spacing their predecessors imply; the concatenation equals decoding every id at once."""
        before = self.tokenizer.decode(self.ids[self._window : self._read], skip_special_tokens=True)
        after = self.tokenizer.decode(self.ids[self._window :], skip_special_tokens=True)
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            return False
        self.text += after[len(before) :]
        self._window, self._read = self._read, len(self.ids)
        return True

    def _visible(self) -> str:
        return self.text if self.stopped_at is None else self.text[: self.stopped_at]

    def _streamable(self) -> str:
        if self.in_tool_section:
            return ""
        visible = self._visible()
        tag = visible.find(TOOL_CALL_OPEN, max(0, self.sent - len(TOOL_CALL_OPEN))) if self.tool_names else -1
        if tag >= 0:
            self.in_tool_section = True
            safe = len(visible[:tag].rstrip())
        else:
            safe = len(visible)
            if self.stopped_at is None:
                safe -= _held_back(visible, [*self.stop, *([TOOL_CALL_OPEN] if self.tool_names else [])])
            safe = min(safe, len(visible[:safe].rstrip())) if self.tool_names else safe
        if safe <= self.sent:
            return ""
        chunk = visible[self.sent : safe]
        self.sent = safe
        return chunk

    def finish(self, finish_reason: str) -> tuple[str, Reply]:
        """Flush at the end of generation: (last content delta, final reply)."""
        if self.stopped_at is None and self._read < len(self.ids):
            scanned = len(self.text)
            self._decode_new(final=True)  # held back waiting for a character that never completed
            self._find_stops(scanned)
        visible = self._visible()
        content, calls = parse_tool_calls(visible, self.tool_names)
        if calls:
            return "", Reply(content=content, tool_calls=calls, finish_reason="tool_calls")
        rest = visible[self.sent :]
        self.sent = len(visible)
        reason = "stop" if self.stopped_at is not None else finish_reason
        return rest, Reply(content=visible, finish_reason=reason)


def _held_back(text: str, markers: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a marker."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-n:]):
                longest = n
                break
    return longest
