"""`areal-proxy engine` bodies: SGLang's native `/generate`, weight updates and pausing.

The subset of SGLang's protocol the embedded engine serves, with SGLang's field names. A
sampling parameter the engine does not have is accepted only at its neutral value (a penalty
of 0, `n` of 1, no grammar), and an unknown one is refused, as SGLang refuses it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from proxy.schemas.common import MAX_ID, MAX_MESSAGES, JsonValue, Seed, StopString, Wire

TokenIds = Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(min_length=1, max_length=1_048_576)]


class SGLangSampling(Wire):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    max_new_tokens: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = 128
    """None: up to the context length."""
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1)] = -1
    """-1: off; 0 is refused, as by SGLang."""
    stop: StopString | Annotated[list[StopString], Field(max_length=16)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=2**31 - 1)]], Field(max_length=256)] | None = None
    ignore_eos: bool = False
    sampling_seed: Seed | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False
    spaces_between_special_tokens: bool = True
    # Accepted only at their neutral values:
    min_p: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    presence_penalty: Literal[0, 0.0] = 0.0
    repetition_penalty: Literal[1, 1.0] = 1.0
    min_new_tokens: Literal[0] = 0
    n: Literal[1] = 1
    json_schema: None = None
    regex: None = None
    ebnf: None = None
    structural_tag: None = None
    logit_bias: None = None
    stop_regex: None = None
    custom_params: None = None


class GenerateRequest(Wire):
    input_ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    text: str | Annotated[list[str], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    sampling_params: SGLangSampling | Annotated[list[SGLangSampling], Field(max_length=MAX_MESSAGES)] | None = None
    rid: Annotated[str, Field(max_length=MAX_ID)] | list[Annotated[str, Field(max_length=MAX_ID)]] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] = False
    logprob_start_len: Annotated[int, Field(ge=-1, le=2**31 - 1)] | list[int] = -1
    top_logprobs_num: Annotated[int, Field(ge=0, le=20)] = 0
    return_text_in_logprobs: bool = False
    # Features of SGLang's /generate the embedded engine does not have (falsy values are fine):
    input_embeds: JsonValue | None = None
    image_data: JsonValue | None = None
    audio_data: JsonValue | None = None
    lora_path: JsonValue | None = None
    session_params: JsonValue | None = None
    return_hidden_states: bool = False

    def unsupported(self) -> str | None:
        for name in ("input_embeds", "image_data", "audio_data", "lora_path", "session_params", "return_hidden_states"):
            if getattr(self, name):
                return name
        return None


class UpdateWeights(Wire):
    model_path: Annotated[str, Field(min_length=1, max_length=4096)]
    weight_version: Annotated[str, Field(max_length=MAX_ID)] | Annotated[int, Field(ge=0, le=2**53 - 1)] | None = None
    abort_all_requests: bool = False
    load_format: Annotated[str, Field(max_length=64)] | None = None


class PauseGeneration(Wire):
    mode: Literal["abort", "retract", "in_place"] = "abort"
