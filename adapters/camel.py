"""CAMEL-AI: a ChatAgent's model backend bound to one proxy session.

    agent = ChatAgent(system_message=..., model=session_model(base_url, api_key), tools=[...])
    await agent.astep(task["question"])

The backend is CAMEL's OpenAI-compatible platform pointed at the session's base
URL, so every call the agent makes (tool turns included) lands in that session.
CAMEL counts tokens to trim its memory, and its default counter downloads a
tiktoken file when the agent is built; `OfflineTokenCounter` counts without any
network, with the served model's tokenizer when one is given, else by UTF-8
bytes, which never undercounts a byte-level BPE tokenizer, so the memory window
stays on the safe side.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Protocol

from camel.models import BaseModelBackend, ModelFactory
from camel.types import ModelPlatformType
from camel.utils import BaseTokenCounter

DEFAULT_MODEL = "smollm2-135m-instruct"
TOKENS_PER_MESSAGE = 4  # role and separators a chat template adds around each message


class Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class OfflineTokenCounter(BaseTokenCounter):
    """CAMEL's token counter without network access."""

    def __init__(self, tokenizer: Tokenizer | None = None) -> None:
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(token_ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode(token_ids)

    def count_tokens_from_messages(self, messages: list[dict[str, Any]]) -> int:
        return sum(TOKENS_PER_MESSAGE + len(self.encode(_message_text(m))) for m in messages)


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # content parts: count the text ones
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = content if isinstance(content, str) else ""
    if message.get("tool_calls"):
        text += json.dumps(message["tool_calls"])
    return text


def session_model(
    base_url: str,
    api_key: str,
    model: str = DEFAULT_MODEL,
    *,
    model_config: dict[str, Any] | None = None,
    token_counter: BaseTokenCounter | None = None,
    timeout: float = 600.0,
    max_retries: int = 3,
) -> BaseModelBackend:
    """A CAMEL model backend whose calls go to one session (`base_url` ends with /v1).

    `model_config` is CAMEL's `model_config_dict` (temperature, max_tokens,
    tool_choice, ...); it is sent with every call. The timeout is longer than
    CAMEL's 180 s default: a call queued behind a busy engine or a weight update
    would otherwise be sent again, and the retry recorded as a second sample.
    """
    camel_log = logging.getLogger("camel")
    if camel_log.level == logging.NOTSET:  # CAMEL's own default; under an INFO root it logs every request
        camel_log.setLevel(logging.WARNING)
    return ModelFactory.create(
        model_platform=ModelPlatformType.OPENAI_COMPATIBLE_MODEL,
        model_type=model,
        model_config_dict=dict(model_config or {}),
        url=base_url,
        api_key=api_key,
        token_counter=token_counter or OfflineTokenCounter(),
        timeout=timeout,
        max_retries=max_retries,
    )
