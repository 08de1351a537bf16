"""`POST /v1/completions` bodies: OpenAI's legacy Completions API, as the `openai` client sends them.

`prompt` is one text or one list of token ids (a one-element list of either is accepted too; a
batch of several prompts is refused by the route). OpenAI's ranges as in Chat Completions, with
`logprobs` an integer (the legacy API's count of alternatives per token, here up to 20 as vLLM
allows). The extensions vLLM and SGLang accept that trainers use: `top_k`, `ignore_eos`,
`return_token_ids` (answer with the prompt's and each choice's token ids) and
`add_special_tokens`. Penalties, `logit_bias` and `user` are accepted and not applied.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from proxy.schemas.chat import StreamOptions
from proxy.schemas.common import JsonObject, JsonValue, Seed, Stop, TokenCount, TopK, TopLogprobs, TopP, Wire

MAX_PROMPT_IDS = 1 << 20
"""Token ids in one prompt: far beyond any context; the context check refuses long ones by name."""

TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_PROMPT_IDS)]
Batch = Field(max_length=1024)
Prompt = str | TokenIds | Annotated[list[str], Batch] | Annotated[list[TokenIds], Batch]


class CompletionRequest(Wire):
    model: Annotated[str, Field(max_length=256)] = ""
    prompt: Prompt
    """Text, tokenized as is (no chat template), or token ids used as given."""
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    """Choices; at most `[proxy] max_n`."""
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None
    """Only equal to `n` (no server-side selection)."""
    max_tokens: TokenCount | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    """-1 or 0: off."""
    seed: Seed | None = None
    stop: Stop = None
    ignore_eos: bool | None = None
    """vLLM's extension: generate past the end-of-sequence token, up to max_tokens."""
    logprobs: TopLogprobs | None = None
    """Log probabilities of every sampled token plus this many alternatives per token."""
    echo: bool | None = None
    """Answer with the prompt's text before the completion's (not with `logprobs`)."""
    suffix: Annotated[str, Field(max_length=1024)] | None = None
    """Insertion is not served: only null or ''."""
    return_token_ids: bool | None = None
    """vLLM's extension: top-level `prompt_token_ids` and each choice's sampled `token_ids`."""
    add_special_tokens: bool | None = None
    """vLLM's extension: let the tokenizer add its special tokens (BOS) to a text prompt; default true."""
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=1024)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None
    metadata: JsonObject | None = None
    extra_body: JsonValue | None = None
