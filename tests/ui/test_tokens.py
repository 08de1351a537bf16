"""Token pieces and prompt splits with the default model's real tokenizer: the pieces of any
sampled ids join to their decoding (characters split across tokens, special tokens, spaces), and a
prompt split never cuts a character in two."""

from __future__ import annotations

import pytest

from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
from proxy.ui.tokens import load_decoder, text_split, token_pieces

TEXTS = [
    "<|im_start|>assistant\nThe answer is 89.<|im_end|>",
    "Hello 世界 🙂 naïve  x=1\n\n\tindented",
    '<tool_call>\n{"name": "calculate", "arguments": {"expression": "19 + 70"}}\n</tool_call>',
    "🙂🙂🙂 ∑ ≠ ∞ — «ok»",
]


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    path = resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")
    return Tokenizer.from_file(f"{path}/tokenizer.json"), load_decoder(path)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_to_the_decoded_text(tokenizer, text):
    tok, decode = tokenizer
    ids = tok.encode(text, add_special_tokens=False).ids
    pieces = token_pieces(decode, ids)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == decode(ids) == text
    assert "\ufffd" not in "".join(pieces)


def test_a_character_split_over_tokens_goes_to_the_token_that_completes_it(tokenizer):
    tok, decode = tokenizer
    ids = tok.encode("世", add_special_tokens=False).ids
    assert len(ids) > 1, "this character is several byte tokens"
    assert token_pieces(decode, ids) == [""] * (len(ids) - 1) + ["世"]


def test_a_prompt_split_inside_a_character_keeps_it_whole(tokenizer):
    tok, decode = tokenizer
    ids = tok.encode("Hello 世界", add_special_tokens=False).ids
    for at in range(len(ids) + 1):
        head, rest = text_split(decode, ids, at)
        assert head + rest == "Hello 世界"
        assert "\ufffd" not in head + rest
