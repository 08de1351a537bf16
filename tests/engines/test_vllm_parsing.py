"""vLLM `/v1/completions` answers and stream chunks → deltas, field by field (PROTOCOLS.md §5)."""

import pytest

from proxy.engines.base import EngineRequestError, GenerationResult, SamplingParams
from proxy.engines.pool import ServerError, WeightVersions
from proxy.engines.vllm import CompletionDecoder, build_completion_request, parse_completion_body, token_id

IM_END = 151645


def choice(ids, logprobs, finish=None, stop_reason=None, top=None, **extra):
    return {
        "index": 0,
        "text": "...",
        "logprobs": {
            "text_offset": list(range(len(ids))),
            "token_logprobs": logprobs,
            "tokens": [f"token_id:{i}" for i in ids],
            "top_logprobs": top if top is not None else [{f"token_id:{i}": lp} for i, lp in zip(ids, logprobs)],
        },
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "token_ids": ids,
        **extra,
    }


def answer(*choices, **extra):
    return {"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": list(choices), **extra}


def test_request_asks_for_token_ids_and_the_sampled_logprob():
    params = SamplingParams(max_new_tokens=32, temperature=0.6, top_p=0.95, stop=("</tool_call>",))
    req = build_completion_request([1, 2, 3], params, "req-1", "qwen")
    assert req["prompt"] == [1, 2, 3]
    assert req["model"] == "qwen"
    assert req["max_tokens"] == 32
    assert req["temperature"] == 0.6 and req["top_p"] == 0.95
    assert req["top_k"] == -1
    assert req["logprobs"] == 0  # the sampled token only
    assert req["return_tokens_as_token_ids"] is True
    assert req["return_token_ids"] is True
    assert req["return_weight_versions"] is True
    assert req["include_stop_str_in_output"] is True
    assert req["skip_special_tokens"] is False
    assert req["stop"] == ["</tool_call>"] and req["stop_token_ids"] == []
    assert req["request_id"] == "req-1" and req["stream"] is True and req["n"] == 1
    assert "seed" not in req


def test_request_seed_top_k_and_alternatives():
    params = SamplingParams(max_new_tokens=4, top_k=40, seed=3, top_logprobs=5, stop_token_ids=(7,), ignore_eos=True)
    req = build_completion_request([1], params, "r", None, stream=False)
    assert req["top_k"] == 40 and req["seed"] == 3 and req["logprobs"] == 5
    assert req["stop_token_ids"] == [7] and req["ignore_eos"] is True
    assert "model" not in req and req["stream"] is False


def test_eos_stop_has_no_stop_reason_and_keeps_the_eos_id():
    delta = parse_completion_body(answer(choice([9707, 11, IM_END], [-0.01, -0.3, -0.02], "stop")))
    assert delta.token_ids == [9707, 11, IM_END]
    assert delta.logprobs == [-0.01, -0.3, -0.02]
    assert delta.finish_reason == "stop"
    assert delta.matched_stop == IM_END
    assert delta.versions == [0, 0, 0]
    assert delta.top_logprobs is None


def test_stop_string_and_stop_token():
    by_string = parse_completion_body(answer(choice([27, 14], [-1.0, -0.5], "stop", "</tool_call>")))
    assert (by_string.finish_reason, by_string.matched_stop) == ("stop", "</tool_call>")
    by_token = parse_completion_body(answer(choice([27, 7], [-1.0, -0.5], "stop", 7)))
    assert (by_token.finish_reason, by_token.matched_stop) == ("stop", 7)


def test_length_and_abort():
    length = parse_completion_body(answer(choice([1, 2], [-0.1, -0.2], "length")))
    assert (length.finish_reason, length.matched_stop, length.abort_message) == ("length", None, None)
    abort = parse_completion_body(answer(choice([1], [-0.1], "abort")))
    assert abort.finish_reason == "abort" and abort.abort_message


def test_clamped_logprob_stays_a_float():
    delta = parse_completion_body(answer(choice([1], [-9999.0], "length")))
    assert delta.logprobs == [-9999.0]


def test_ids_come_from_logprob_tokens_when_token_ids_are_missing():
    c = choice([5, 6], [-0.1, -0.2], "length")
    del c["token_ids"]
    assert parse_completion_body(answer(c)).token_ids == [5, 6]


def test_tokens_not_spelled_as_ids_are_a_server_error():
    c = choice([5], [-0.1], "length")
    del c["token_ids"]
    c["logprobs"]["tokens"] = ["Hello"]
    with pytest.raises(ServerError, match="return_tokens_as_token_ids"):
        parse_completion_body(answer(c))
    assert token_id("token_id:42") == 42


def test_logprobs_that_do_not_match_the_ids_are_a_server_error():
    c = choice([5, 6], [-0.1, -0.2], "length")
    c["logprobs"]["token_logprobs"] = [-0.1]
    with pytest.raises(ServerError):
        parse_completion_body(answer(c))


def test_top_logprobs_are_sorted_and_cut_to_k():
    # vLLM returns the k best plus the sampled token (here 6, outside the top 2).
    top = [{"token_id:6": -3.0, "token_id:8": -0.5, "token_id:9": -1.5}]
    delta = parse_completion_body(answer(choice([6], [-3.0], "length", top=top)), top_logprobs=2)
    assert delta.top_logprobs == [[(8, -0.5), (9, -1.5)]]


def test_weight_version_spans():
    spans = [{"version": "4", "start": 0, "end": 1}, {"version": "5", "start": 1, "end": 3}]
    versions = WeightVersions()
    delta = parse_completion_body(answer(choice([1, 2, 3], [-0.1] * 3, "length", weight_versions=spans)), versions)
    assert delta.versions == [4, 5, 5]
    assert versions.current == 5


def test_stream_chunks_are_deltas():
    decoder = CompletionDecoder(WeightVersions(), top_logprobs=0)
    spans = [{"version": "2", "start": 0, "end": 4}]
    chunks = [
        answer(choice([10, 11], [-0.1, -0.2], prompt_token_ids=[1, 2, 3])),
        answer(choice([12], [-0.3])),
        answer(choice([IM_END], [-0.4], "stop", weight_versions=spans)),
        {
            "id": "cmpl-1",
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        },
    ]
    deltas = [decoder.feed(c) for c in chunks]
    assert deltas[-1] is None
    assert [d.token_ids for d in deltas[:3]] == [[10, 11], [12], [IM_END]]
    assert deltas[2].finish_reason == "stop" and deltas[2].matched_stop == IM_END
    assert deltas[2].versions == [2]  # spans arrive with the last chunk only
    result = GenerationResult()
    for d in deltas[:3]:
        result.extend(d)
    assert result.output_ids == [10, 11, 12, IM_END]
    assert result.logprobs == [-0.1, -0.2, -0.3, -0.4]
    assert decoder.finished


def test_empty_chunk_is_skipped():
    decoder = CompletionDecoder(WeightVersions())
    assert decoder.feed(answer(choice([], []))) is None


def test_in_stream_errors_by_code():
    decoder = CompletionDecoder(WeightVersions())
    nested = {"error": {"message": "max_tokens too large", "type": "BadRequestError", "param": None, "code": 400}}
    with pytest.raises(EngineRequestError, match="max_tokens too large"):
        decoder.feed(nested)
    with pytest.raises(ServerError, match="Internal server error"):
        decoder.feed({"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}})
    flat = {"object": "error", "message": "bad prompt", "type": "BadRequestError", "code": 400}
    with pytest.raises(EngineRequestError, match="bad prompt"):
        decoder.feed(flat)


def test_body_without_finish_reason_is_not_a_complete_answer():
    with pytest.raises(ServerError, match="finish reason"):
        parse_completion_body(answer(choice([1], [-0.1])))
