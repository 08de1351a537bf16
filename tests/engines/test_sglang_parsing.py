"""SGLang `/generate` bodies and stream chunks → deltas, field by field (PROTOCOLS.md §4)."""

import pytest

from proxy.engines.base import EngineRequestError, GenerationResult, SamplingParams
from proxy.engines.pool import ServerError, WeightVersions
from proxy.engines.sglang import StreamDecoder, build_generate_request, parse_finish, parse_generate_body

IM_END = 151645

# The keys sglang 0.5.23 accepts in sampling_params; it rejects any other with a 400.
SGLANG_SAMPLING_KEYS = {
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema",
    "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
    "watermark", "choice",
}  # fmt: skip


def body(ids, logprobs, finish=None, version="default", **meta):
    return {
        "text": "...",
        "output_ids": ids,
        "meta_info": {
            "id": "r1",
            "finish_reason": finish,
            "prompt_tokens": 12,
            "completion_tokens": len(ids),
            "weight_version": version,
            "output_token_logprobs": [[lp, i, None] for lp, i in zip(logprobs, ids, strict=True)],
            "output_token_logprobs_length": len(ids),
            **meta,
        },
    }


def test_request_always_sets_max_new_tokens_and_asks_for_logprobs():
    params = SamplingParams(max_new_tokens=64, temperature=0.7, top_p=0.9, stop=("</tool_call>",))
    req = build_generate_request([1, 2, 3], params, "req-1")
    assert req["input_ids"] == [1, 2, 3]
    assert req["rid"] == "req-1"
    assert req["stream"] is True
    assert req["return_logprob"] is True
    assert req["logprob_start_len"] == -1
    assert req["top_logprobs_num"] == 0
    sp = req["sampling_params"]
    assert sp["max_new_tokens"] == 64
    assert sp["temperature"] == 0.7 and sp["top_p"] == 0.9
    assert sp["top_k"] == -1  # top-k off
    assert sp["stop"] == ["</tool_call>"] and sp["stop_token_ids"] == []
    assert sp["skip_special_tokens"] is False and sp["no_stop_trim"] is True
    assert "sampling_seed" not in sp
    assert set(sp) <= SGLANG_SAMPLING_KEYS


def test_request_seed_top_k_and_top_logprobs():
    params = SamplingParams(max_new_tokens=8, top_k=20, seed=7, top_logprobs=5, stop_token_ids=(9,), ignore_eos=True)
    req = build_generate_request([1], params, "r", stream=False)
    sp = req["sampling_params"]
    assert sp["top_k"] == 20 and sp["sampling_seed"] == 7
    assert sp["stop_token_ids"] == [9] and sp["ignore_eos"] is True
    assert req["top_logprobs_num"] == 5 and req["stream"] is False
    assert set(sp) <= SGLANG_SAMPLING_KEYS


def test_eos_stop_keeps_the_matched_token_in_output_ids():
    delta = parse_generate_body(body([9707, 11, IM_END], [-0.0012, -0.31, -0.05], {"type": "stop", "matched": IM_END}))
    assert delta.token_ids == [9707, 11, IM_END]
    assert delta.logprobs == [-0.0012, -0.31, -0.05]
    assert delta.finish_reason == "stop"
    assert delta.matched_stop == IM_END
    assert delta.abort_message is None
    assert delta.versions == [0, 0, 0]  # "default" is the version the engine started with
    assert delta.top_logprobs is None


def test_stop_string_matched():
    delta = parse_generate_body(body([27, 14, 29], [-1.0, -2.0, -0.5], {"type": "stop", "matched": "</tool_call>"}))
    assert delta.finish_reason == "stop"
    assert delta.matched_stop == "</tool_call>"
    assert delta.token_ids == [27, 14, 29]


def test_length_finish():
    delta = parse_generate_body(body([5, 6], [-0.1, -0.2], {"type": "length", "length": 2}))
    assert (delta.finish_reason, delta.matched_stop, delta.abort_message) == ("length", None, None)


def test_abort_with_message_keeps_the_tokens():
    finish = {"type": "abort", "message": "Abort in waiting queue", "status_code": None, "err_type": None}
    delta = parse_generate_body(body([5, 6], [-0.1, -0.2], finish))
    assert delta.finish_reason == "abort"
    assert delta.abort_message == "Abort in waiting queue"
    assert delta.token_ids == [5, 6]


def test_abort_before_any_token_with_a_4xx_status_is_a_request_error():
    finish = {"type": "abort", "message": "input is longer than the context", "status_code": 400}
    with pytest.raises(EngineRequestError, match="longer than the context"):
        parse_generate_body(body([], [], finish))


def test_clamped_logprob_stays_a_float():
    delta = parse_generate_body(body([5, 6], [-999999999.0, -0.2], {"type": "length", "length": 2}))
    assert delta.logprobs[0] == -999999999.0
    assert isinstance(delta.logprobs[0], float)


def test_int_weight_version_is_the_version():
    versions = WeightVersions()
    delta = parse_generate_body(body([5], [-0.1], {"type": "length", "length": 1}, version="7"), versions)
    assert delta.versions == [7]
    assert versions.current == 7


def test_weight_version_spans_give_per_token_versions():
    spans = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}]
    b = body(
        [1, 2, 3, 4, IM_END],
        [-0.1] * 5,
        {"type": "stop", "matched": IM_END},
        version="4",
        weight_versions=spans,
    )
    assert parse_generate_body(b).versions == [3, 3, 4, 4, 4]


def test_non_int_labels_map_to_the_version_they_were_set_with():
    versions = WeightVersions()
    versions.set("step-a", 5)
    b = body([1, 2], [-0.1, -0.1], {"type": "length", "length": 2}, version="step-a")
    assert parse_generate_body(b, versions).versions == [5, 5]


def test_top_logprobs_are_id_logprob_pairs_cut_to_k():
    top = [
        [[-0.1, 5, None], [-2.5, 8, None], [-3.0, 9, None]],
        [[-0.2, 6, None], [-1.9, 3, None], [-4.0, 1, None]],
    ]
    b = body([5, 6], [-0.1, -0.2], {"type": "length", "length": 2}, output_top_logprobs=top)
    delta = parse_generate_body(b, top_logprobs=2)
    assert delta.top_logprobs == [[(5, -0.1), (8, -2.5)], [(6, -0.2), (3, -1.9)]]


def test_cumulative_chunks_become_deltas():
    decoder = StreamDecoder(WeightVersions())
    chunks = [
        body([10, 11], [-0.1, -0.2]) | {"text": None},
        body([10, 11], [-0.1, -0.2]) | {"text": None},  # nothing new
        body([10, 11, 12, 13], [-0.1, -0.2, -0.3, -0.4]) | {"text": None},
        body([10, 11, 12, 13, IM_END], [-0.1, -0.2, -0.3, -0.4, -0.5], {"type": "stop", "matched": IM_END}),
    ]
    deltas = [decoder.feed(c) for c in chunks]
    assert deltas[1] is None
    assert [d.token_ids for d in deltas if d] == [[10, 11], [12, 13], [IM_END]]
    assert [d.logprobs for d in deltas if d] == [[-0.1, -0.2], [-0.3, -0.4], [-0.5]]
    assert [d.finish_reason for d in deltas if d] == [None, None, "stop"]
    assert deltas[-1].matched_stop == IM_END
    assert decoder.incremental is False and decoder.finished
    result = GenerationResult()
    for d in deltas:
        if d:
            result.extend(d)
    assert result.output_ids == [10, 11, 12, 13, IM_END]
    assert result.finish_reason == "stop"


def incremental(ids, logprobs, total, finish=None, version="default", **meta):
    """What --incremental-streaming-output sends: sliced lists, cumulative counters."""
    b = body(ids, logprobs, finish, version, **meta)
    b["meta_info"]["completion_tokens"] = total
    b["meta_info"]["output_token_logprobs_length"] = total
    return b


def test_incremental_chunks_are_detected_by_the_cumulative_counter():
    decoder = StreamDecoder(WeightVersions())
    d1 = decoder.feed(incremental([10, 11], [-0.1, -0.2], 2))
    d2 = decoder.feed(incremental([12], [-0.3], 3))
    d3 = decoder.feed(incremental([IM_END], [-0.4], 4, {"type": "stop", "matched": IM_END}))
    assert decoder.incremental is True
    assert [d1.token_ids, d2.token_ids, d3.token_ids] == [[10, 11], [12], [IM_END]]
    assert d3.logprobs == [-0.4] and d3.finish_reason == "stop"


def test_incremental_chunks_without_counters_are_detected_by_their_prefix():
    decoder = StreamDecoder(WeightVersions())
    chunks = [
        body([10, 11], [-0.1, -0.2]),
        body([12, 13], [-0.3, -0.4]),
        body([14], [-0.5], {"type": "length"}),
    ]
    for c in chunks:
        del c["meta_info"]["completion_tokens"], c["meta_info"]["output_token_logprobs_length"]
    deltas = [decoder.feed(c) for c in chunks]
    assert [d.token_ids for d in deltas] == [[10, 11], [12, 13], [14]]
    assert decoder.incremental is True


def test_incremental_mode_can_be_configured():
    decoder = StreamDecoder(WeightVersions(), incremental=False)
    decoder.feed(body([10], [-0.1]))
    assert decoder.feed(body([10, 11], [-0.1, -0.2])).token_ids == [11]


def test_streamed_top_logprobs_follow_the_new_tokens():
    decoder = StreamDecoder(WeightVersions(), top_logprobs=1)
    row = [[-0.1, 10, None]], [[-0.2, 11, None]], [[-0.3, 12, None]]
    decoder.feed(body([10], [-0.1], output_top_logprobs=list(row[:1])))
    delta = decoder.feed(body([10, 11, 12], [-0.1, -0.2, -0.3], output_top_logprobs=list(row)))
    assert delta.top_logprobs == [[(11, -0.2)], [(12, -0.3)]]


def test_version_changes_between_chunks_are_kept_per_delta():
    decoder = StreamDecoder(WeightVersions())
    d1 = decoder.feed(body([10, 11], [-0.1, -0.2], version="1"))
    d2 = decoder.feed(body([10, 11, 12], [-0.1, -0.2, -0.3], version="2"))
    spans = [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 2, "end": 4}]
    final = body([10, 11, 12, 13], [-0.1] * 4, {"type": "length", "length": 4}, version="2", weight_versions=spans)
    d3 = decoder.feed(final)
    assert (d1.versions, d2.versions, d3.versions) == ([1, 1], [2], [2])
    assert decoder.versions.current == 2


def test_in_stream_error_by_code():
    decoder = StreamDecoder(WeightVersions())
    error = {
        "error": {
            "message": "prompt too long",
            "type": "invalid_request_error",
            "code": 400,
            "retryable": False,
        }
    }
    with pytest.raises(EngineRequestError, match="prompt too long"):
        decoder.feed(error)
    with pytest.raises(ServerError, match="scheduler died"):
        decoder.feed({"error": {"message": "scheduler died", "code": 500}})


def test_logprobs_that_do_not_match_the_ids_are_a_server_error():
    b = body([1, 2], [-0.1, -0.2])
    b["output_ids"] = [1, 3]
    with pytest.raises(ServerError):
        StreamDecoder(WeightVersions()).feed(b)


def test_body_without_finish_reason_is_not_a_complete_answer():
    with pytest.raises(ServerError, match="finish reason"):
        parse_generate_body(body([1], [-0.1]))


def test_finish_reason_shapes():
    assert parse_finish({"type": "stop", "matched": [7, 8]}, 8) == ("stop", 8, None)
    assert parse_finish({"type": "length", "length": 3}, 1) == ("length", None, None)
    assert parse_finish({"type": "abort"}, None) == ("abort", None, "aborted by the engine")
    assert parse_finish({"type": "weird"}, None)[0] == "abort"
