"""Sampled token ids as the text pieces the session page paints with logprob and version heat.

Decoding each id alone garbles text: a byte-level BPE token may hold half of a UTF-8 character,
and SentencePiece tokenizers drop a word's leading space when it starts the decoded text. So a
token's piece is what it adds to the decoding of a few tokens before it, and a token that ends
inside a character adds nothing until the token that completes it (which then carries the whole
character). The pieces joined are the decoded sequence, special tokens included: the page shows
exactly what was sampled and trained on, an end-of-turn token and tool-call markup as well.

The decoder is the `tokenizers` one of the served model: the running proxy's renderer's, or for
`areal-proxy ui` the tokenizer file of the configured model, loaded without torch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

Decode = Callable[[list[int]], str]
CONTEXT = 4
"""Tokens decoded before a token to find its piece: enough for a character split over tokens
and for a tokenizer's leading-space rule to apply to a token other than the one measured."""
INCOMPLETE = "\ufffd"


def token_pieces(decode: Decode, ids: Sequence[int]) -> list[str]:
    """The text each id adds to the decoded sequence; `"".join(pieces) == decode(ids)` whenever the
    tokenizer's decoding is a concatenation (byte-level BPE, SentencePiece with byte fallback)."""
    ids = list(ids)
    pieces: list[str] = []
    start = 0  # first token whose text is not yet given out
    for i in range(len(ids)):
        lo = max(0, start - CONTEXT)
        before = decode(ids[lo:start])
        after = decode(ids[lo : i + 1])
        if after.endswith(INCOMPLETE) and i + 1 < len(ids) and i + 1 - start < CONTEXT:
            pieces.append("")  # half a character: the token that completes it carries it
            continue
        pieces.append(after[len(before) :] if after.startswith(before) else decode(ids[start : i + 1]))
        start = i + 1
    return pieces


def text_split(decode: Decode, ids: Sequence[int], at: int) -> tuple[str, str]:
    """The decoded text of `ids[:at]` and what the rest adds to it (a prompt: what its parent's
    sequence already held, and what this turn's request added)."""
    ids = list(ids)
    whole = decode(ids)
    head = decode(ids[:at])
    for _ in range(CONTEXT):  # a split inside a character: the character goes with the rest
        if at == 0 or whole.startswith(head):
            break
        at -= 1
        head = decode(ids[:at])
    if whole.startswith(head):
        return head, whole[len(head) :]
    return head, decode(ids[at:])


def decoder_of(tokenizer: Any) -> Decode | None:
    """A raw decoder (special tokens kept, no clean-up of spaces) from a transformers tokenizer or a
    `tokenizers.Tokenizer`; None for anything else."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or tokenizer
    decode = getattr(backend, "decode", None)
    if decode is None or not hasattr(backend, "id_to_token"):
        return None
    return lambda ids: decode(ids, skip_special_tokens=False)


def load_decoder(model_path: str) -> Decode | None:
    """The decoder of a model directory's `tokenizer.json`; None (the page then shows ids) if there
    is none, e.g. a hub id not in the local cache."""
    path = Path(model_path).expanduser() / "tokenizer.json"
    if not path.is_file():
        log.warning("no tokenizer.json under %s: the UI shows token ids instead of text", model_path)
        return None
    from tokenizers import Tokenizer

    return decoder_of(Tokenizer.from_file(str(path)))
