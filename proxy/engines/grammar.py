"""Structured output for the embedded engine: a JSON schema compiled by llguidance into a matcher
that says, before each token, which tokens keep the reply inside the schema.

A request's `SamplingParams.json_schema` (a serialized JSON schema; `{"type":"object"}` for
OpenAI's `json_object` mode) is checked when the request arrives (`schema_error`: no tokenizer
needed, so the proxy can answer 400 before generating, whatever engine serves it). The engine
builds the llguidance tokenizer once (`Grammars`, ~0.4 s for a 49k vocabulary), compiles each
schema once and gives every request a copy of the compiled matcher (`Matcher`). Per token a
matcher costs one mask computation (~20 µs for a small schema) and one `consume_token`. Once the
JSON value is complete only an end-of-sequence token is allowed, so the reply ends there.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from llguidance import LLMatcher, LLTokenizer
from llguidance.hf import from_tokenizer

from proxy.engines.base import InvalidSampling

ANY_JSON_OBJECT = '{"type":"object"}'
"""The schema of OpenAI's `json_object` mode (and SGLang's): any JSON object."""
PARAM = "response_format"
_COMPILED = 64  # schemas kept compiled per engine


def serialize(schema: dict[str, Any]) -> str:
    """A schema as the string `SamplingParams.json_schema` holds. Keys keep their order: the
    grammar emits object properties in the order the schema lists them."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


@lru_cache(maxsize=256)
def schema_error(schema: str) -> str | None:
    """What llguidance refuses in `schema` (e.g. `Unimplemented keys: ["not"]`), or None when it
    compiles."""
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema)
    except ValueError as exc:
        return str(exc)
    return LLMatcher.validate_grammar(grammar) or None


def check_schema(schema: str) -> None:
    """Raise `InvalidSampling` (a 400 naming `response_format`) for a schema llguidance refuses."""
    error = schema_error(schema)
    if error is not None:
        raise _unsupported(error)


@lru_cache(maxsize=256)
def lark_error(lark: str) -> str | None:
    """What llguidance refuses in a Lark grammar (a required call's, built from the tools' schemas)."""
    try:
        grammar = LLMatcher.grammar_from_lark(lark)
    except ValueError as exc:
        return str(exc)
    return LLMatcher.validate_grammar(grammar) or None


def check_lark(lark: str) -> None:
    error = lark_error(lark)
    if error is not None:
        raise InvalidSampling(f"tool_choice: a tool's parameters schema is not supported: {error}", "tools")


def _unsupported(error: str) -> InvalidSampling:
    return InvalidSampling(f"response_format: the JSON schema is not supported: {error}", PARAM)


def _failed(error: str) -> InvalidSampling:
    """A matcher that fails mid-reply (a schema only decoding finds impossible, e.g. `{"$ref": "#"}`);
    llguidance's message goes on with a dump of its parser state: its first line names the fault."""
    return InvalidSampling(f"structured output failed: {error.splitlines()[0][:300] if error else 'no reason'}", PARAM)


class Matcher:
    """One request's place in its grammar."""

    def __init__(self, matcher: LLMatcher, vocab: int, eos_ids: tuple[int, ...]) -> None:
        self._m = matcher
        self._vocab = vocab
        self._eos = list(eos_ids)

    def allowed(self) -> torch.Tensor:
        """(V,) bool: the tokens that may come next. Once the value is complete, the EOS tokens."""
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        if self._m.is_error():
            raise _failed(self._m.get_error())
        accepting = self._m.is_accepting()
        if not accepting and not bits.any():
            raise _failed("the grammar allows no next token")
        allowed = torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self._vocab].view(bool))
        if accepting:
            allowed[self._eos] = True
        return allowed

    def advance(self, token: int) -> None:
        """Move past a sampled token (an EOS ends the reply and is not fed to the grammar)."""
        if token in self._eos:
            return
        if not self._m.consume_token(token):
            raise _failed(self._m.get_error())


class Grammars:
    """One engine's llguidance tokenizer and its compiled schemas (engine thread only)."""

    def __init__(self, tokenizer: Any, vocab: int, eos_ids: tuple[int, ...]) -> None:
        self._tokenizer: LLTokenizer = from_tokenizer(tokenizer, n_vocab=vocab, eos_token=list(eos_ids))
        self._vocab = vocab
        self._eos = eos_ids
        self._compiled: OrderedDict[tuple[str, str], LLMatcher] = OrderedDict()

    def matcher(self, schema: str | None = None, lark: str | None = None) -> Matcher:
        """A fresh matcher for a JSON `schema` or a `lark` grammar, compiled at most once while it
        stays among the recent."""
        key = ("lark", lark) if lark is not None else ("json", schema)
        compiled = self._compiled.get(key)
        if compiled is None:
            if lark is not None:
                check_lark(lark)
                grammar = LLMatcher.grammar_from_lark(lark)
            else:
                check_schema(schema)
                grammar = LLMatcher.grammar_from_json_schema(schema)
            compiled = LLMatcher(self._tokenizer, grammar, log_level=0)
            if compiled.is_error():
                raise _unsupported(compiled.get_error())
            self._compiled[key] = compiled
            if len(self._compiled) > _COMPILED:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(key)
        return Matcher(compiled.deep_copy(), self._vocab, self._eos)
