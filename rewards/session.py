"""The read-only view of a finished session that reward functions receive.

It is built from the store once the episode ends: every completion (tree node)
with the messages it was asked with and the assistant message it returned, plus
the task's metadata and reference answer. The "final" conversation is the path
from the root to the most recent leaf, which is what an agent loop ends on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class CompletionView:
    id: str
    parent_id: str | None
    messages: tuple[Mapping[str, Any], ...]  # the request's messages (OpenAI chat shape)
    response: Mapping[str, Any]  # the assistant message returned (content, tool_calls)
    finish_reason: str
    created_at: float

    @property
    def text(self) -> str:
        return self.response.get("content") or ""

    @property
    def tool_calls(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(self.response.get("tool_calls") or ())


@dataclass(frozen=True)
class SessionView:
    session_id: str
    task_id: str | None
    group_id: str | None
    reference: str | None
    metadata: Mapping[str, Any]
    completions: tuple[CompletionView, ...]  # in creation order
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def last(self) -> CompletionView | None:
        return self.completions[-1] if self.completions else None

    @property
    def messages(self) -> tuple[Mapping[str, Any], ...]:
        """The final conversation: the last completion's messages plus its reply."""
        last = self.last
        if last is None:
            return ()
        return (*last.messages, last.response)

    @property
    def final_text(self) -> str:
        """Text of the last assistant reply ('' when there is none)."""
        last = self.last
        return last.text if last is not None else ""

    @property
    def tool_calls(self) -> tuple[Mapping[str, Any], ...]:
        """Every tool call the assistant made, in order, across the final conversation."""
        calls: list[Mapping[str, Any]] = []
        for message in self.messages:
            if message.get("role") == "assistant":
                calls.extend(message.get("tool_calls") or ())
        return tuple(calls)

    def final_answer_number(self) -> str | None:
        """The number the final reply answers with (GSM8K-style extraction), normalised."""
        from rewards.extract import extract_answer_number

        return extract_answer_number(self.final_text)
