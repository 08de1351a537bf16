"""Structured output in the embedded engine: llguidance refuses what it cannot compile with a
message naming the construct, the mask allows only tokens that keep the reply in the schema (and
only EOS once it is complete), sampling never leaves the mask and reports the masked
distribution's logprobs, and the real model's samples all validate."""

from __future__ import annotations

import asyncio
import json
import math

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer

from proxy.engines.base import InvalidSampling, SamplingParams, generate
from proxy.engines.config import EngineConfig
from proxy.engines.grammar import ANY_JSON_OBJECT, Grammars, check_schema, schema_error, serialize
from proxy.engines.local import LocalEngine
from proxy.engines.sampling import process_logits, sample
from proxy.render import Renderer
from proxy.runtime.model_files import DEFAULT_MODEL, resolve_model

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL, "~/.cache/areal-proxy"))


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"not": {"type": "string"}}, '["not"]'),
        ({"type": "string", "pattern": "(?<=a)b"}, "look-around"),
        ({"type": "string", "format": "weird"}, "Unknown format: weird"),
        ({"$ref": "#/defs/missing"}, "/defs/missing"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum (5) is greater than maximum (1)"),
    ],
)
def test_a_refused_schema_names_what_llguidance_refused(schema, named):
    with pytest.raises(InvalidSampling) as caught:
        check_schema(serialize(schema))
    assert named in str(caught.value) and caught.value.param == "response_format"


def test_supported_schemas_compile():
    assert schema_error(serialize(SCHEMA)) is None
    assert schema_error(ANY_JSON_OBJECT) is None


def test_the_mask_keeps_the_reply_in_the_schema_and_ends_it_with_eos(tokenizer):
    eos = (tokenizer.eos_token_id,)
    grammars = Grammars(tokenizer, len(tokenizer), eos)
    matcher = grammars.matcher(serialize(SCHEMA))
    first = matcher.allowed()
    assert all(tokenizer.decode([t]).startswith("{") for t in first.nonzero().flatten().tolist())
    assert not first[eos[0]]
    reply = '{"name":"Ada","age":36,"colour":"green","tags":["x"]}'
    for token in tokenizer.encode(reply):
        assert matcher.allowed()[token], tokenizer.decode([token])
        matcher.advance(token)
    assert matcher.allowed().nonzero().flatten().tolist() == list(eos)
    # a second request gets its own copy from the start
    assert torch.equal(grammars.matcher(serialize(SCHEMA)).allowed(), first)


def test_a_token_outside_the_schema_fails_the_request(tokenizer):
    matcher = Grammars(tokenizer, len(tokenizer), (tokenizer.eos_token_id,)).matcher(ANY_JSON_OBJECT)
    with pytest.raises(InvalidSampling, match="structured output failed"):
        matcher.advance(tokenizer.encode("hello")[0])


def test_sampling_stays_in_the_mask_and_reports_the_masked_distribution():
    vocab = 50
    logits = torch.randn(4000, vocab, generator=torch.Generator().manual_seed(0))
    allowed = torch.zeros(vocab, dtype=torch.bool)
    allowed[[3, 17, 41]] = True
    params = [SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.9)] * len(logits)
    out = sample(logits, params, [None] * len(logits), [allowed] * len(logits))
    assert set(out.token_ids) <= {3, 17, 41}
    for row in range(0, len(logits), 500):
        allowed_logits = logits[row, [3, 17, 41]]
        processed = process_logits(logits[row : row + 1], params[:1], [allowed])[0]
        token = out.token_ids[row]
        assert math.isclose(out.logprobs[row], float(processed[token]), rel_tol=1e-5)
        # over the allowed tokens only: without top-p it would be log_softmax of the three logits
        full = torch.log_softmax(allowed_logits, -1)
        assert float(processed.exp().sum()) == pytest.approx(1.0) and processed[[3, 17, 41]].max() >= full.max()
    # rows without a mask are untouched by a neighbour's mask
    mixed = sample(logits[:2], params[:2], [None, None], [allowed, None])
    assert mixed.token_ids[0] in (3, 17, 41)
    greedy = sample(logits[:1], [SamplingParams(max_new_tokens=1, temperature=0.0)], [None], [allowed])
    assert greedy.token_ids[0] == [3, 17, 41][int(torch.argmax(logits[0, [3, 17, 41]]))]


def test_the_embedded_engine_samples_valid_json_at_temperature_one():
    async def main():
        engine = LocalEngine(EngineConfig(threads=1))
        await engine.start()
        try:
            renderer = Renderer(engine.tokenizer, engine.info.eos_token_ids)
            ask = "Describe a person as JSON with name, age, colour and tags."
            prompt = renderer.prompt([{"role": "user", "content": ask}], None, None).ids
            params = SamplingParams(max_new_tokens=120, temperature=1.0, seed=7, json_schema=serialize(SCHEMA))
            results = await asyncio.gather(
                *(
                    generate(engine, prompt, SamplingParams(**{**params.__dict__, "seed": 7 + i}), request_id=f"r{i}")
                    for i in range(12)
                ),
                generate(engine, prompt, SamplingParams(max_new_tokens=8), request_id="plain"),
            )
            for result in results[:-1]:
                assert result.finish_reason == "stop" and result.output_ids[-1] in engine.info.eos_token_ids
                text = engine.tokenizer.decode(result.output_ids[:-1])
                jsonschema.validate(json.loads(text), SCHEMA)
                assert all(lp <= 0 and math.isfinite(lp) for lp in result.logprobs)
            bad = SamplingParams(max_new_tokens=8, json_schema=serialize({"not": {}}))
            with pytest.raises(InvalidSampling, match=r'\["not"\]'):
                await generate(engine, prompt, bad, request_id="bad")
        finally:
            await engine.stop()

    asyncio.run(main())


def test_sglang_gets_the_schema_as_its_json_schema_sampling_param():
    from proxy.engines.sglang import build_generate_request
    from tests.engines.test_sglang_parsing import SGLANG_SAMPLING_KEYS

    schema = serialize(SCHEMA)
    sp = build_generate_request([1], SamplingParams(max_new_tokens=8, json_schema=schema), "r")["sampling_params"]
    assert sp["json_schema"] == schema and set(sp) <= SGLANG_SAMPLING_KEYS
    assert "json_schema" not in build_generate_request([1], SamplingParams(max_new_tokens=8), "r")["sampling_params"]


def test_vllm_gets_the_schema_as_structured_outputs_json():
    from proxy.engines.vllm import build_completion_request

    body = build_completion_request([1], SamplingParams(max_new_tokens=8, json_schema=serialize(SCHEMA)), "r", "m")
    assert body["structured_outputs"] == {"json": SCHEMA}
    assert "guided_json" not in body  # removed in vLLM 0.12
    assert "structured_outputs" not in build_completion_request([1], SamplingParams(max_new_tokens=8), "r", "m")


def test_top_logprobs_list_only_tokens_the_grammar_allows():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(3))
    allowed = torch.zeros(50, dtype=torch.bool)
    allowed[[4, 9]] = True
    out = sample(logits, [SamplingParams(max_new_tokens=1, top_logprobs=5)], [None], [allowed])
    [top] = out.top_logprobs
    assert sorted(t for t, _ in top) == [4, 9] and all(math.isfinite(v) for _, v in top)
