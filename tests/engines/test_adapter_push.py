"""LoRA adapter pushes to remote engines: SGLang and vLLM load the adapter by name, requests name it,
every token of a request is of the adapter version it was sampled with, old adapters are unloaded."""

from __future__ import annotations

import asyncio

from proxy.engines.base import SamplingParams
from proxy.engines.config import EngineConfig
from proxy.engines.sglang import SGLangEngine
from proxy.engines.vllm import VLLMEngine
from tests.conftest import serve_app
from tests.engines.test_pool import canned_sglang, canned_vllm, generate, model_dir  # noqa: F401


def test_sglang_loads_adapters_by_name_and_requests_name_the_newest(model_dir):  # noqa: F811
    calls: list = []
    with serve_app(canned_sglang(calls, model_dir)) as url:

        async def scenario():
            engine = SGLangEngine(EngineConfig(backend="sglang", urls=[url], timeout_s=10))
            await engine.start()
            assert not engine.merges_adapters
            params = SamplingParams(max_new_tokens=8)
            await engine.update_weights("/w/v0000001", 1, adapter=True)
            assert calls[-1] == ("load_lora_adapter", {"lora_name": "areal-v1", "lora_path": "/w/v0000001"})
            assert not any(c[0] == "update_weights_from_disk" for c in calls), "the base weights stay"
            assert engine.version == 1
            result = await generate(engine, [1, 2], params, request_id="r1")
            assert calls[-1][1]["lora_path"] == "areal-v1"
            # The server reports its base weights' version for every token; the adapter's is what counts.
            assert result.versions == [1] * len(result.output_ids)
            for v in (2, 3):
                await engine.update_weights(f"/w/v{v:07d}", v, adapter=True)
            assert ("unload_lora_adapter", {"lora_name": "areal-v1"}) in calls
            assert not any(c == ("unload_lora_adapter", {"lora_name": "areal-v2"}) for c in calls), "may be in use"
            result = await generate(engine, [1, 2], params, request_id="r2")
            assert calls[-1][1]["lora_path"] == "areal-v3" and result.versions == [3] * len(result.output_ids)
            await engine.update_weights("/w/full", 4)  # full weights: no adapter named any more
            result = await generate(engine, [1], params, request_id="r3")
            assert "lora_path" not in calls[-1][1]
            await engine.stop()

        asyncio.run(scenario())


def test_vllm_loads_adapters_by_name_and_requests_name_them_as_the_model(model_dir):  # noqa: F811
    calls: list = []
    with serve_app(canned_vllm(calls, model_dir)) as url:

        async def scenario():
            engine = VLLMEngine(EngineConfig(backend="vllm", urls=[url], timeout_s=10))
            await engine.start()
            await engine.update_weights("/w/v0000005", 5, adapter=True)
            assert calls[-1][0] == "load_lora_adapter"
            assert calls[-1][2] == {"lora_name": "areal-v5", "lora_path": "/w/v0000005"}
            assert not any(c[0] == "collective_rpc" for c in calls), "no full reload"
            result = await generate(engine, [1, 2, 3], SamplingParams(max_new_tokens=8), request_id="r1")
            assert calls[-1][2]["model"] == "areal-v5"
            assert result.versions == [5] * len(result.output_ids)
            await engine.stop()

        asyncio.run(scenario())
