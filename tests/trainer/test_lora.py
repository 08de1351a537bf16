"""LoRA training: a step moves only the adapters; the merge the engine does from a pushed adapter folder
equals peft's own merge and the model the trainer trains; checkpoints hold the adapter and a servable merged
model, and resume puts the adapter back."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from proxy.config import Config
from proxy.runtime.adapters import is_adapter, load_adapter, merge
from tests.conftest import tiny_llama
from tests.trainer.test_batch_step import sample
from trainer import checkpoint, policy
from trainer.batch import pack
from trainer.config import LoraConfig, TrainerConfig
from trainer.step import train_step
from trainer.weights import write_adapter

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-base")
    tiny_llama().save_pretrained(folder)
    return folder


def lora_config(**trainer) -> Config:
    tcfg = TrainerConfig(lora=LoraConfig(rank=4, alpha=8.0, target_modules=TARGETS), **trainer)
    tcfg.optim.lr = 1e-2
    return Config(trainer=tcfg)


def batch() -> list:
    samples = [sample([5, 6, 7, 8, 9], [0, 0, 0, 1, 1], 1.0), sample([5, 6, 7, 10, 11], [0, 0, 0, 1, 1], -1.0)]
    return pack(samples, 8192, 0)


def trained(base_dir, steps: int = 2) -> policy.Policy:
    cfg = lora_config()
    torch.manual_seed(0)
    pol = policy.build(cfg, torch.device("cpu"), str(base_dir), None)
    for _ in range(steps):
        train_step(pol.model, pol.optimizer, batch(), cfg.trainer, torch.device("cpu"), 0, pol.reference)
    return pol


def test_a_lora_step_changes_only_the_adapters(base_dir):
    cfg = lora_config()
    pol = policy.build(cfg, torch.device("cpu"), str(base_dir), None)
    assert pol.is_lora
    before = {k: v.clone() for k, v in pol.model.state_dict().items()}
    frozen = {n for n, p in pol.model.named_parameters() if not p.requires_grad}
    assert frozen and all(".lora_" not in n for n in frozen), "every base weight is frozen"
    assert {id(p) for p in pol.trainable} == {id(p) for n, p in pol.model.named_parameters() if ".lora_" in n}
    train_step(pol.model, pol.optimizer, batch(), cfg.trainer, torch.device("cpu"), 0, pol.reference)
    after = pol.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "the step moved nothing"
    assert all(".lora_B." in k for k in changed), sorted(changed)[:5]  # B starts at 0, so A's gradient is 0 at first
    assert len([k for k in changed if ".lora_B." in k]) == 2 * len(TARGETS)  # every adapted layer of both layers


def test_the_merged_weights_equal_peft_and_the_trained_model(base_dir, tmp_path):
    pol = trained(base_dir)
    write_adapter(pol.peft_model, tmp_path / "v1")
    assert is_adapter(tmp_path / "v1")
    assert not list((tmp_path / "v1").glob("model*.safetensors")), "only the adapter is pushed"
    adapter = load_adapter(tmp_path / "v1")
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    merged = merge(base.state_dict(), adapter)
    assert len(merged) == 2 * len(TARGETS)
    reference = copy.deepcopy(pol.peft_model).merge_and_unload().state_dict()
    for key, value in merged.items():
        torch.testing.assert_close(value, reference[key], rtol=0, atol=1e-6)
    # The merged model (what the engine samples from) gives the trained model's logits.
    base.load_state_dict(merged, strict=False)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        torch.testing.assert_close(base(ids).logits, pol.model(ids).logits, rtol=0, atol=1e-5)
    assert set(policy.merged_state_dict(pol.peft_model)) == set(
        AutoModelForCausalLM.from_pretrained(base_dir).state_dict()
    )


def test_an_adapter_the_engine_cannot_merge_is_refused_by_name(base_dir, tmp_path):
    import json

    pol = trained(base_dir, steps=1)
    write_adapter(pol.peft_model, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    config["use_dora"] = True
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="use_dora"):
        load_adapter(tmp_path / "a")


def test_a_checkpoint_holds_the_adapter_and_a_servable_merged_model_and_resumes(base_dir, tmp_path):
    pol = trained(base_dir)
    state = checkpoint.TrainerState(step=2, version=2)
    final = checkpoint.save(tmp_path, pol.model, pol.optimizer, state, write_model=pol.save_model)
    assert (final / policy.ADAPTER_DIR / "adapter_config.json").is_file()
    served = AutoModelForCausalLM.from_pretrained(final).eval()  # `areal-proxy serve --model <checkpoint>`
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(served(ids).logits, pol.model(ids).logits, rtol=0, atol=1e-5)
    resumed = policy.build(lora_config(), torch.device("cpu"), str(base_dir), final)
    assert checkpoint.load_state(final, resumed.optimizer).step == 2
    trained_state = pol.model.state_dict()
    for key, value in resumed.model.state_dict().items():
        assert torch.equal(value, trained_state[key]), key
    assert resumed.trainable and all(p.requires_grad for p in resumed.trainable)
    # Adam's moments came back with the adapter: the next step is the same from either.
    train_step(pol.model, pol.optimizer, batch(), lora_config().trainer, torch.device("cpu"), 0, pol.reference)
    train_step(
        resumed.model, resumed.optimizer, batch(), lora_config().trainer, torch.device("cpu"), 0, resumed.reference
    )
    after = resumed.model.state_dict()
    for key, value in pol.model.state_dict().items():
        torch.testing.assert_close(after[key], value, rtol=0, atol=1e-7)


def test_a_full_checkpoint_cannot_resume_as_lora(base_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    opt = torch.optim.AdamW(model.parameters())
    final = checkpoint.save(tmp_path, model, opt, checkpoint.TrainerState(step=1))
    with pytest.raises(ValueError, match="holds no LoRA adapter"):
        policy.build(lora_config(), torch.device("cpu"), str(base_dir), final)


def test_the_kl_reference_is_the_base_with_adapters_off(base_dir):
    cfg = lora_config()
    cfg.trainer.loss.kl_coef = 0.1
    fresh = policy.build(cfg, torch.device("cpu"), str(base_dir), None)
    ref = fresh.reference
    assert ref is not None and ref.model is fresh.model, "no second copy of the weights"
    for p in fresh.trainable:  # a trained-looking adapter, which the reference must not see
        torch.nn.init.normal_(p, std=0.5)
    base = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad(), ref.active() as model:
        torch.testing.assert_close(model(ids).logits, base(ids).logits, rtol=0, atol=1e-6)
    with torch.no_grad():
        assert not torch.allclose(fresh.model(ids).logits, base(ids).logits, atol=1e-3)
