"""The prompt encoder gives the ids the tokenizer gives the whole text, remembered pieces or not:
the default model's tokenizer on texts mixing its special tokens, and tokenizers of the other
pre-tokenizer kinds built here (byte-level as Llama 3 and Qwen split it, Metaspace as Mistral and
Llama 2 prepend it), including those where remembering pieces would change the ids."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from proxy.prompt_encoder import PromptEncoder
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CORPUS = [
    "You are a helpful assistant. What is 12 + 35? The answer is 47.",
    "  leading spaces, trailing spaces  \n\n new lines\tand tabs",
    "Ünïcödé, emoji 🙂, 中文 and numbers 1234567890",
] * 20


@pytest.fixture(scope="module")
def smollm():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))


def built(pre_tokenizer, lstrip=False) -> PreTrainedTokenizerFast:
    tk = Tokenizer(models.BPE(unk_token=None))
    tk.pre_tokenizer = pre_tokenizer
    tk.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet))
    tk.add_special_tokens([AddedToken(s, special=True, lstrip=lstrip, normalized=False) for s in SPECIALS])
    tk.add_tokens([AddedToken("<tool_call>", special=False)])
    return PreTrainedTokenizerFast(tokenizer_object=tk)


def naive(tok, text: str) -> list[int]:
    """Pieces encoded one by one without the guards: what remembering pieces would give."""
    ids = []
    for i, piece in enumerate(re.split("(" + "|".join(map(re.escape, SPECIALS)) + ")", text)):
        alone = tok.backend_tokenizer.encode(piece, add_special_tokens=False).ids
        ids += [tok.convert_tokens_to_ids(piece)] if i % 2 else alone
    return ids


texts = st.lists(
    st.one_of(
        st.sampled_from([*SPECIALS, "<tool_call>", "\n", " ", "  ", "system\n", "assistant\n", "<|im", "end|>"]),
        st.text(max_size=12),
    ),
    max_size=12,
).map("".join)

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@EXAMPLES
@given(text=texts)
def test_the_default_tokenizer_gives_the_same_ids_cold_and_warm(smollm, text):
    enc = PromptEncoder(smollm, cache_tokens=64)
    assert enc.pattern is not None  # SmolLM2's tokenizer is one whose pieces are remembered
    whole = smollm.encode(text, add_special_tokens=False)
    assert enc.encode(text) == whole
    assert enc.encode(text) == whole  # its pieces now remembered


def test_a_chat_prompt_is_mostly_remembered_pieces_and_the_memory_stays_bounded(smollm):
    enc = PromptEncoder(smollm, cache_tokens=200)
    system = "<|im_start|>system\nYou are a careful travel agent. " * 3 + "<|im_end|>\n"
    for i in range(300):
        text = f"{system}<|im_start|>user\nQuestion {i}: the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
        assert enc.encode(text) == smollm.encode(text, add_special_tokens=False)
    assert enc.hits > enc.misses
    assert enc._held <= 200
    assert sum(len(ids) or 1 for ids in enc._pieces.values()) == enc._held


BYTE_LEVEL = pre_tokenizers.ByteLevel(add_prefix_space=False)
LLAMA3_LIKE = pre_tokenizers.Sequence(
    [pre_tokenizers.Split(Regex(r"\p{N}{1,3}| ?\p{L}+|\s+(?!\S)|\s+|."), "isolated"), BYTE_LEVEL]
)


@pytest.mark.parametrize(
    ("name", "pre_tokenizer", "pieces"),
    [
        ("byte level", BYTE_LEVEL, True),
        ("split then byte level", LLAMA3_LIKE, True),
        ("metaspace, prefix on every piece", pre_tokenizers.Metaspace(prepend_scheme="always"), True),
        ("metaspace, prefix at the start only", pre_tokenizers.Metaspace(prepend_scheme="first"), False),
    ],
)
def test_pre_tokenizer_kinds(name, pre_tokenizer, pieces):
    tok = built(pre_tokenizer)
    enc = PromptEncoder(tok)
    assert (enc.pattern is not None) == pieces, name
    text = "<|im_start|>user\nhello world 123<|im_end|>\n<|im_start|>assistant\n<tool_call>x"
    for _ in range(2):
        assert enc.encode(text) == tok.encode(text, add_special_tokens=False), name
    if not pieces:  # the guard matters: pieces encoded alone would have been prefixed
        assert naive(tok, text) != tok.encode(text, add_special_tokens=False)


def test_an_unnormalized_plain_added_token_cuts_the_text_as_special_ones_do():
    """The tokenizer cuts the raw text at every added token it matches unnormalized, special or not,
    leftmost first: one that starts before an overlapping special token wins."""
    tok = built(BYTE_LEVEL)
    tok.backend_tokenizer.add_tokens([AddedToken("a<|", special=False, normalized=False)])
    enc = PromptEncoder(tok)
    text = "a<|im_start|>b <tool_call> c<|im_end|>"
    whole = tok.encode(text, add_special_tokens=False)
    assert tok.convert_tokens_to_ids("a<|") in whole  # the plain token won the overlap
    assert enc.encode(text) == whole
    assert enc.encode(text) == whole
    assert naive(tok, text) != whole  # cutting at the special tokens alone gets it wrong


def test_a_special_token_that_strips_spaces_is_left_to_the_tokenizer():
    tok = built(BYTE_LEVEL, lstrip=True)
    enc = PromptEncoder(tok)
    text = "hello   <|im_end|> world"
    assert enc.pattern is None
    assert enc.encode(text) == tok.encode(text, add_special_tokens=False)
    assert naive(tok, text) != tok.encode(text, add_special_tokens=False)


def test_settings_changed_on_the_shared_tokenizer_are_followed(smollm):
    enc = PromptEncoder(smollm)
    text = "<|im_start|>user\nhi<|im_end|>"
    enc.encode(text)
    smollm.split_special_tokens = True
    smollm.backend_tokenizer.encode_special_tokens = True
    try:
        assert enc.encode(text) == smollm.encode(text, add_special_tokens=False)
        assert len(enc.encode(text)) > 5  # the markers spelled out, not one id each
    finally:
        smollm.split_special_tokens = False
        smollm.backend_tokenizer.encode_special_tokens = False
    smollm.backend_tokenizer.enable_truncation(3)
    try:
        assert enc.encode(text) == smollm.encode(text, add_special_tokens=False)
    finally:
        smollm.backend_tokenizer.no_truncation()
    assert enc.encode(text) == smollm.encode(text, add_special_tokens=False)
