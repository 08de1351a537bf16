"""Prompt text to token ids, with the pieces between special tokens remembered.

A fast tokenizer cuts its input at its added tokens matched on the raw text (the special tokens,
as a rule) before anything else and encodes each piece on its own, so a prompt's ids are the
pieces' ids with those tokens' ids between them. Agents send the same pieces again and again (a
system prompt and tool schemas on every new episode, a GRPO group's prompt n times, each
template's `assistant\\n`), and encoding costs about a microsecond a token while holding the GIL;
a remembered piece costs a dictionary lookup.

Only where that holds exactly: the Rust encoder as transformers leaves it (no truncation or
padding, special tokens split), those tokens matched as plain strings (no stripping or whole
words), and a pre-tokenizer that treats every piece alike, which Metaspace prepending only at the
start of the text does not. Otherwise the whole text is encoded at once: by the Rust encoder while
transformers' settings allow it, else by transformers.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

# Token ids kept at most, over all remembered pieces: ~10-20 MB of Python ints and keys.
CACHE_TOKENS = 1 << 18
# Pre-tokenizers that treat each piece the same wherever it sits in the text.
_PIECEWISE = {
    "ByteLevel",
    "Split",
    "Digits",
    "Punctuation",
    "Whitespace",
    "WhitespaceSplit",
    "BertPreTokenizer",
    "UnicodeScripts",
    "CharDelimiterSplit",
}


def _piecewise(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(_piecewise(p) for p in pre_tokenizer.get("pretokenizers", []))
    if kind == "Metaspace":
        return pre_tokenizer.get("prepend_scheme") in ("always", "never")
    return kind in _PIECEWISE


def _first_pass_pattern(backend: Any) -> tuple[re.Pattern[str] | None, dict[str, int]]:
    """The added tokens the tokenizer cuts the raw text at (those it matches unnormalized, special
    or not) as one leftmost-longest pattern, and their ids; no pattern when one of them is matched
    other than as its plain string. Added tokens matched after normalization are found inside each
    piece by the encoder itself, as it finds them in the whole text."""
    ids: dict[str, int] = {}
    for token_id, token in backend.get_added_tokens_decoder().items():
        if token.normalized:
            continue
        if token.lstrip or token.rstrip or token.single_word:
            return None, {}
        ids[token.content] = token_id
    if not ids:
        return None, {}
    # Longest first: at the leftmost match the regex takes the first alternative that fits, as the
    # tokenizer's leftmost-longest matcher does.
    alternatives = sorted(ids, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(a) for a in alternatives) + ")"), ids


class PromptEncoder:
    """`encode(text)`: the ids `tokenizer.encode(text, add_special_tokens=False)` gives."""

    def __init__(self, tokenizer: Any, cache_tokens: int = CACHE_TOKENS) -> None:
        self.tokenizer = tokenizer
        self.backend = tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else None
        self.pattern: re.Pattern[str] | None = None
        self.cut_ids: dict[str, int] = {}
        if self.backend is not None:
            pre = self.backend.pre_tokenizer
            if _piecewise(json.loads(pre.__getstate__()) if pre is not None else None):
                self.pattern, self.cut_ids = _first_pass_pattern(self.backend)
        self.cache_tokens = cache_tokens
        self._pieces: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def _backend_ready(self) -> bool:
        """The Rust encoder as transformers' `encode` would use it, checked each call: a caller may
        have set truncation, padding or special-token splitting on the shared tokenizer since."""
        b = self.backend
        return (
            b is not None
            and b.truncation is None
            and b.padding is None
            and b.encode_special_tokens == bool(getattr(self.tokenizer, "split_special_tokens", False))
        )

    def encode(self, text: str) -> list[int]:
        if not self._backend_ready():
            return self.tokenizer.encode(text, add_special_tokens=False)
        if self.pattern is None or self.backend.encode_special_tokens:
            return self.backend.encode(text, add_special_tokens=False).ids
        ids: list[int] = []
        parts = self.pattern.split(text)
        for i, part in enumerate(parts):
            if i % 2:
                ids.append(self.cut_ids[part])
            elif part:
                ids.extend(self._piece(part))
        return ids

    def _piece(self, piece: str) -> tuple[int, ...]:
        with self._lock:
            ids = self._pieces.get(piece)
            if ids is not None:
                self._pieces.move_to_end(piece)
                self.hits += 1
                return ids
        ids = tuple(self.backend.encode(piece, add_special_tokens=False).ids)
        with self._lock:
            self.misses += 1
            if len(ids) <= self.cache_tokens and piece not in self._pieces:
                self._pieces[piece] = ids
                self._held += len(ids) or 1
                while self._held > self.cache_tokens:
                    _, old = self._pieces.popitem(last=False)
                    self._held -= len(old) or 1
        return ids
