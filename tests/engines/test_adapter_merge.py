"""A LoRA adapter sent to a real `areal-proxy engine` server is merged into its weights: outputs change,
every token after it carries the adapter's version, its logprobs are the adapted model's, and each merge
starts from the base weights (a zero adapter after a trained one gives the base model back exactly).
The proxy's SGLang backend sees that the server merges adapters and sends them as weight updates."""

from __future__ import annotations

import asyncio

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM

from proxy.engines.base import SamplingParams
from proxy.engines.config import EngineConfig
from proxy.engines.sglang import SGLangEngine
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model
from tests.engines.test_pool import generate

PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 28, 314, 9428, 1317, 30, 2, 198, 1, 4093, 198]
TARGETS = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture(scope="module")
def base_path():
    return resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy")


@pytest.fixture(scope="module")
def adapters(base_path, tmp_path_factory):
    """A trained-looking adapter (random A and B) and the same adapter zeroed, as peft saves them, and the
    adapted model's reference."""
    root = tmp_path_factory.mktemp("adapters")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))
    for name, p in lora.named_parameters():
        if ".lora_" in name:
            torch.nn.init.normal_(p, std=0.05)
    lora.save_pretrained(root / "trained")
    merged = lora.merge_and_unload().eval()
    zero = peft.get_peft_model(
        AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32),
        peft.LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS),
    )
    zero.save_pretrained(root / "zero")  # B = 0: no change
    return root / "trained", root / "zero", merged


def reference_logprobs(model, prompt: list[int], output: list[int]) -> list[float]:
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]


def test_an_adapter_is_merged_from_the_base_and_sampled_under_its_version(tmp_path, engine_runner, adapters):
    trained, zero, merged = adapters
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    with engine_runner(tmp_path) as server:
        assert server.get("/model_info").json()["merges_lora_adapters"] is True

        async def scenario():
            engine = SGLangEngine(EngineConfig(backend="sglang", urls=[server.url], timeout_s=120))
            await engine.start()
            assert engine.merges_adapters
            base = await generate(engine, PROMPT, greedy, request_id="base")
            await engine.update_weights(str(trained), 1, adapter=True)
            assert engine.version == 1
            adapted = await generate(engine, PROMPT, greedy, request_id="adapted")
            assert adapted.output_ids != base.output_ids, "the adapter changes what the model says"
            assert adapted.versions == [1] * len(adapted.output_ids)
            want = reference_logprobs(merged, PROMPT, adapted.output_ids)
            assert max(abs(a - b) for a, b in zip(adapted.logprobs, want)) < 1e-3
            await engine.update_weights(str(zero), 2, adapter=True)
            back = await generate(engine, PROMPT, greedy, request_id="zero")
            assert back.output_ids == base.output_ids and back.versions == [2] * len(back.output_ids)
            assert max(abs(a - b) for a, b in zip(back.logprobs, base.logprobs)) < 1e-6, "merged onto the base"
            await engine.update_weights(str(trained), 3, adapter=True)
            again = await generate(engine, PROMPT, greedy, request_id="again")
            assert again.output_ids == adapted.output_ids
            assert max(abs(a - b) for a, b in zip(again.logprobs, adapted.logprobs)) < 1e-6
            await engine.stop()

        asyncio.run(scenario())
        bad = server.post("/update_weights_from_disk", json={"model_path": str(tmp_path), "weight_version": "9"})
        assert bad.status_code == 400
