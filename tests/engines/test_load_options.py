"""Engine and trainer load models without Hub kernels, on every device, so nothing is fetched at run time."""

from __future__ import annotations

import torch

from proxy.runtime.devices import model_load_options
from tests.conftest import tiny_llama


def test_no_hub_kernels_anywhere_and_cpu_keeps_its_attention():
    cpu = model_load_options(torch.device("cpu"))
    assert cpu["use_kernels"] is False
    assert cpu["attn_implementation"], "CPU uses the grouped eager attention"
    # A device other than CPU (meta stands in for cuda/npu, which this machine may lack): kernels
    # off, and transformers picks the attention.
    assert model_load_options(torch.device("meta")) == {"use_kernels": False}


def test_a_model_loaded_with_them_stays_unkernelized_through_train(tmp_path):
    from transformers import AutoModelForCausalLM

    tiny_llama().save_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, **model_load_options(torch.device("cpu")))
    assert model.use_kernels is False
    model.train()  # where transformers would kernelize for training (and fetch kernels on CUDA)
    assert model.use_kernels is False
    assert model.kernels_mode is None
