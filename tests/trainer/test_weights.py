"""Pushed weights: a Hugging Face directory from_pretrained reads, in the engine's dtype when given."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from tests.conftest import tiny_llama
from trainer.weights import private_dir, write_weights


def tiny(tied: bool) -> LlamaForCausalLM:
    return tiny_llama(num_hidden_layers=1, tie_word_embeddings=tied)


def test_weights_are_written_as_the_model_holds_them(tmp_path):
    model = tiny(tied=True)
    write_weights(model, tmp_path / "v1")
    state = load_file(str(tmp_path / "v1" / "model.safetensors"))
    assert "lm_head.weight" not in state, "a tied head is stored once"
    assert all(t.dtype == torch.float32 for t in state.values())
    back = LlamaForCausalLM.from_pretrained(tmp_path / "v1")
    for (name, a), b in zip(model.named_parameters(), back.parameters()):
        assert torch.equal(a, b), name
    assert not (tmp_path / "v1.tmp").exists()


def test_weights_in_the_engine_dtype_round_as_the_engine_would(tmp_path):
    model = tiny(tied=False)
    write_weights(model, tmp_path / "v2", torch.bfloat16)
    state = load_file(str(tmp_path / "v2" / "model.safetensors"))
    assert "lm_head.weight" in state
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    engine = tiny(tied=False).to(torch.bfloat16)
    engine.load_state_dict(state)
    for (name, a), b in zip(model.named_parameters(), engine.parameters()):
        assert torch.equal(a.detach().to(torch.bfloat16), b), name


def test_the_weights_folder_is_private(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o777)
    loose.chmod(0o777)
    assert private_dir(loose) == loose and loose.stat().st_mode & 0o777 == 0o700
    fresh = private_dir(tmp_path / "a" / "b")
    assert fresh.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_weights_folder_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    with pytest.raises(PermissionError, match="belongs to uid 65534"):
        private_dir(theirs)
