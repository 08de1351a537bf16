"""Settled reply text in, reasoning / content / tool calls out, as the text arrives.

Two stages, each holding back only the tail that could still become one of its markers:
reasoning (text between the family's think tags at the reply's start, or from the start when
the prompt opened the block) and then the tool section (from the first marker on, read one
call at a time by the family's `ToolFormat`). Each piece of text is scanned once per stage, so
a long reply costs its length, not its length squared. The same deltas, concatenated, are the
final message: a streamed and an unstreamed reply of the same tokens are identical.

Malformed calls never fail a reply: from the first block that cannot be a valid call (broken
JSON, no name, a tool not offered), the rest of the reply is plain content; calls read before
it stand. Blank text before the first call is dropped; text after a call that opens no further
call is dropped, as SGLang's and vLLM's parsers drop it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.parsers.base import ReasoningFormat, ToolFormat


@dataclass
class Delta:
    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.calls)


def held_back(text: str, markers: tuple[str, ...] | list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a marker."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-n:]):
                longest = n
                break
    return longest


class ReasoningSplitter:
    """Reasoning at the start of a reply, between `fmt.start` and `fmt.end`."""

    def __init__(self, fmt: ReasoningFormat, inside: bool) -> None:
        self.fmt = fmt
        self.state = "reasoning" if inside else "start"
        self.hold = ""
        self.strip_next = inside  # blanks opening the reasoning or the answer after it are dropped

    def feed(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) settled by `text`."""
        self.hold += text
        if self.state == "start":
            head = self.hold.lstrip()
            if head.startswith(self.fmt.start):
                self.state, self.hold, self.strip_next = "reasoning", head[len(self.fmt.start) :], True
            elif self.fmt.start.startswith(head) and not final:
                return "", ""
            else:
                self.state = "content"
        if self.state == "reasoning":
            if self.strip_next:
                self.hold = self.hold.lstrip()
                if not self.hold:
                    return "", ""
                self.strip_next = False
            at = self.hold.find(self.fmt.end)
            if at < 0:
                keep = 0 if final else held_back(self.hold, (self.fmt.end,))
                out, self.hold = self.hold[: len(self.hold) - keep], self.hold[len(self.hold) - keep :]
                return out, ""
            out, self.hold = self.hold[:at], self.hold[at + len(self.fmt.end) :]
            self.state, self.strip_next = "content", True
            return out, self._content()
        return "", self._content()

    def _content(self) -> str:
        out, self.hold = self.hold, ""
        if self.strip_next:
            out = out.lstrip()
            self.strip_next = not out
        return out


class ToolSection:
    """Content until the first tool marker, then calls read one at a time."""

    def __init__(self, fmt: ToolFormat | None) -> None:
        self.fmt = fmt
        self.state = "content" if fmt is not None else "plain"
        self.hold = ""  # content not yet emitted (a possible marker, trailing blanks)
        self.started = False  # content other than blanks was emitted: leading markers no longer count
        self.section = ""  # the tool section not yet read
        self.skipped = ""  # blanks dropped before the section: content again if it proves bad
        self.framing = ""  # framing read since the last call (a list's bracket): content again if bad
        self.calls = 0

    def feed(self, text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        if self.state == "plain":
            return text, []
        if self.state == "content":
            self.hold += text
            content = self._content(final)
            if self.state != "tools":
                return content, []
            text = ""
        else:
            content = ""
        self.section += text
        calls = []
        while self.state == "tools" and self.section:
            step = self.fmt.next_call(self.section, final)
            if step.kind == "more":
                break
            if step.kind == "bad":  # this block and what follows are the model's text
                self.state = "plain"
                content += (self.skipped if not self.calls else "") + self.framing + self.section
                self.section = ""
                break
            if step.kind == "skip":
                self.framing += self.section[: step.used]
            self.section = self.section[step.used :]
            if step.call is not None:
                calls.append(step.call)
                self.calls += 1
                self.framing = ""
            if step.kind == "done":
                break
        return content, calls

    def _content(self, final: bool) -> str:
        fmt = self.fmt
        at = -1
        for marker in fmt.markers:
            i = self.hold.find(marker)
            if i >= 0 and (at < 0 or i < at):
                at = i
        if not self.started:
            head = self.hold.lstrip()
            lead = len(self.hold) - len(head)
            if any(head.startswith(m) for m in fmt.leading_markers):
                at = lead
            elif head and not final and any(m.startswith(head) for m in fmt.leading_markers):
                return ""
        if at >= 0:
            before = self.hold[:at]
            kept = before.rstrip()
            self.skipped = before[len(kept) :]
            self.state, self.section, self.hold = "tools", self.hold[at:], ""
            self.started = self.started or bool(kept)
            return kept
        if final:
            out, self.hold = self.hold, ""
            return out
        keep = held_back(self.hold, fmt.markers)
        safe = self.hold[: len(self.hold) - keep]
        safe = safe.rstrip()  # trailing blanks wait: dropped if a call follows
        if not self.started and not safe.strip():
            return ""
        out, self.hold = safe, self.hold[len(safe) :]
        self.started = True
        return out
